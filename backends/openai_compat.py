"""Engines that speak OpenAI's routes (vLLM, trtllm-serve, llama-server, TGI's Messages API, MII's server).

The thin path: the request goes out nearly as the client sent it (``to_payload``), streamed, or whole
when the gateway takes the answer whole (``GenerationRequest.whole``, ``asks_whole``), and each SSE
chunk (or the whole answer) becomes neutral pieces (``parse_chunk``) that ``generate`` turns into
``Chunk``s.
Those two and their helpers are pure and live in ``backends/openai_wire.py``; this module is the
adapter around them (HTTP, the stream, stop strings, errors).

What a subclass sets (its engine's quirks, as data and one hook):

- ``capabilities``: what the engine honours (``backends.capabilities``). Only the capability fields it
  names go out; extras outside OpenAI's spec go out only when named in ``capabilities.extras`` (any
  other extra is never sent: engines such as trtllm-serve refuse unknown fields).
- ``engine_fields(request) -> dict``: the capability fields in the engine's own form. The default
  writes them as OpenAI spells them (``openai_fields``); a subclass renames or reshapes by calling
  ``super().engine_fields(request)`` and editing the dict it gets (a key set to ``None`` there is
  dropped; a key the body already has, such as ``temperature``, is replaced). It is called only
  when the request uses a capability field (``uses_fields``), so plain text requests cost what they
  always did.
- ``ask_usage``, ``usage_per_choice``, ``trusts_event_status``, ``end_texts``, ``asks_whole``: see the
  attributes.

A subclass that builds its own body calls ``to_payload(request, served_model, capabilities,
ask_usage)``, which writes the OpenAI form of what ``capabilities`` covers; one that reads its own
stream calls ``parse_chunk(doc)`` (``ParsedChunk.choices``, each a ``ParsedChoice``, and ``usage``).

Answers: every choice of a chunk is read (``backends/openai_wire.py`` says what of it). Each choice
ends with its own finish chunk, yielded when the stream ends. Usage is on the stream's last chunk only: with ``n`` > 1
that is the finish chunk of the highest-indexed choice, and it is the whole request's usage (the
engine's one count over every choice, or the engine's per-choice counts added up); the other choices'
finish chunks carry none. Stop strings are cut per choice, except when the client asked vLLM's
``include_stop_str_in_output``: the engine then cuts and keeps the stop in the answer. An engine with
its own ``n`` (``capabilities.native_n``) must answer every choice from 0 to ``n`` - 1, each with its
finish reason: a stream that ends without one is a protocol error, never an answer with a choice
missing or left open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

from backends.answer_stream import AnswerStream
from backends.base import Chunk, GenerationRequest
from backends.capabilities import PLAIN, Capabilities
from backends.http_base import HttpBackend
from backends.openai_wire import (
    END_TEXTS,
    FINISH,
    NO_LOGPROB,
    ParsedChoice,
    ParsedChunk,
    add_usage,
    message_text,
    openai_fields,
    parse_choice,
    parse_chunk,
    to_payload,
    trimmed,
    uses_fields,
)

# The wire functions were defined here first: the engines' adapters import them from this module.
__all__ = [
    "END_TEXTS",
    "FINISH",
    "NO_LOGPROB",
    "OpenAICompatBackend",
    "ParsedChoice",
    "ParsedChunk",
    "add_usage",
    "message_text",
    "openai_fields",
    "parse_choice",
    "parse_chunk",
    "to_payload",
    "trimmed",
    "uses_fields",
]


class OpenAICompatBackend(HttpBackend):
    """A backend for an engine's OpenAI routes; subclasses set the engine's quirks as class attributes
    and reshape capability fields in ``engine_fields``."""

    engine = "openai"
    capabilities: ClassVar[Capabilities] = PLAIN
    ask_usage: ClassVar[bool] = True
    """The engine sends usage in streams when asked (``stream_options.include_usage``)."""
    usage_per_choice: ClassVar[bool] = False
    """With ``n`` > 1 the engine reports usage once per choice (llama-server), not once for all: the
    reports are added up (completion tokens; the prompt counted once)."""
    trusts_event_status: ClassVar[bool] = True
    end_texts: ClassVar[tuple[str, ...]] = ()
    """End-of-turn texts the engine streams as if they were content; cut like stop strings."""

    asks_whole: ClassVar[bool] = True
    """The engine answers ``stream: false`` with the same answer it would stream (usage included): a
    request the gateway takes whole (``GenerationRequest.whole``) is asked whole, which costs the engine
    and the gateway less than a stream of it. False: every request is streamed."""

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        """The request's capability fields in the engine's own form (called only when it uses one)."""
        return openai_fields(request, self.capabilities)

    def answers_whole(self, request: GenerationRequest, whole: bool | None = None) -> bool:
        """``WholeAnswers``: asked whole when the gateway needs nothing of the answer before its end. With
        ``n`` > 1 an engine that counts usage per choice (llama-server) is streamed, where its reports are
        added up."""
        asked_whole = request.whole if whole is None else whole
        return asked_whole and self.asks_whole and (request.n == 1 or not self.usage_per_choice)

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        fields = self.engine_fields(request) if uses_fields(request) else {}
        whole = self.answers_whole(request)
        return to_payload(request, self.settings.served_model, self.capabilities, self.ask_usage, fields, not whole)

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return AnswerStream(self, request)

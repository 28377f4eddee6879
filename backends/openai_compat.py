"""Engines that speak OpenAI's routes (vLLM, trtllm-serve, llama-server, TGI's Messages API, MII's server).

The thin path: the request goes out nearly as the client sent it (``to_payload``), always streamed,
and each SSE chunk becomes neutral pieces (``parse_chunk``) that ``generate`` turns into ``Chunk``s.
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
- ``ask_usage``, ``usage_per_choice``, ``trusts_event_status``, ``end_texts``: see the attributes.

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

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, TokenLogprob, ToolCallDelta, Usage
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
from backends.text import StopStrings, estimate_tokens

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


class _ChoiceState:
    """What ``generate`` tracks for one choice while its stream runs."""

    __slots__ = ("finish", "pieces", "stop_reason", "stops")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = StopStrings(stops)
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.pieces = 0


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

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        """The request's capability fields in the engine's own form (called only when it uses one)."""
        return openai_fields(request, self.capabilities)

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        fields = self.engine_fields(request) if uses_fields(request) else {}
        return to_payload(request, self.settings.served_model, self.capabilities, self.ask_usage, fields)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        usage: Usage | None = None
        # Engines stop at stop strings, but some stream a stop's first tokens before they see the rest
        # (trtllm-serve), and some stream end-of-turn text (MII, TGI's completions): text that may
        # still become a stop is held back until it is clear, per choice.
        # The client asked vLLM to keep the stop string in the answer: the engine cuts, not the gateway.
        keeps_stop = bool(request.extra) and request.extra.get("include_stop_str_in_output") is True
        stop_texts = self.end_texts if keeps_stop else (*request.stop, *self.end_texts)
        states: dict[int, _ChoiceState] = {}
        expected = request.n if self.capabilities.native_n else 1
        async with self.open_stream(request, path, self.payload(request)) as response:
            async for batch in self.json_event_batches(request, response, self.trusts_event_status):
                out: list[tuple[str, int, tuple[ToolCallDelta, ...], tuple[TokenLogprob, ...]]] = []
                for doc in batch:
                    parsed = parse_chunk(doc)
                    if parsed.usage is not None:
                        usage = add_usage(usage, parsed.usage) if self.usage_per_choice else parsed.usage
                    for choice in parsed.choices:
                        index = choice.index
                        state = states.get(index)
                        if state is None:
                            state = states[index] = _ChoiceState(stop_texts)
                        state.finish = choice.finish or state.finish
                        if choice.stop_reason is not None:
                            state.stop_reason = choice.stop_reason
                        stops = state.stops
                        if stops.stopped:  # what arrived after the stop is not the answer
                            continue
                        text = ""
                        if choice.text:
                            state.pieces += 1
                            text = stops.feed(choice.text)
                        logprobs = choice.logprobs
                        if logprobs:
                            logprobs = trimmed(logprobs, request.top_logprobs)
                        if text or choice.tool_calls or logprobs:
                            out.append((text, index, choice.tool_calls, logprobs))
                last = len(out) - 1
                for i, (text, index, calls, logprobs) in enumerate(out):  # one per event, marked as arriving together
                    yield Chunk(text, None, None, i < last, index, calls, logprobs)
                if (
                    not self.ask_usage
                    and len(states) >= expected
                    and all(s.stops.stopped or s.finish is not None for s in states.values())
                ):
                    break  # nothing more worth reading: closing also stops the engine
        if not states:
            states[0] = _ChoiceState(stop_texts)
        lost = [i for i in range(expected) if i not in states] + sorted(i for i in states if not 0 <= i < expected)
        if lost:  # a choice never answered (or one never asked for): the answer is not the one asked
            what = "never answered" if lost[0] < expected else "never asked for"
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: choice {lost[0]} of n={expected} {what}")
        for state in states.values():
            if state.stops.stopped:
                state.finish = "stop"
            if state.finish is None:
                raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without a finish reason")
        if usage is None:  # the engine never says: count streamed pieces (one a token), estimate the prompt
            pieces = sum(s.pieces for s in states.values())
            usage = Usage(estimate_tokens(message_text(request)), pieces, prompt_estimated=True)
        order = sorted(states)
        for index in order:
            state = states[index]
            # Held text that starts the stop string the engine says it stopped on is not the answer.
            reason = state.stop_reason
            named = reason if isinstance(reason, str) and reason in request.stop else None
            tail = "" if named is not None else state.stops.flush()
            matched = state.stops.matched
            if matched not in request.stop:  # an end-of-turn text, not the client's stop
                matched = named
            yield Chunk(
                text=tail,
                finish_reason=state.finish,
                usage=usage if index == order[-1] else None,
                index=index,
                stop_sequence=matched if state.finish == "stop" else None,
            )

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

from backends import http_errors
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

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        answer = _Answer(request, self)
        payload = self.payload(request)
        response = await self.opened(request, path, payload)
        try:
            if not payload["stream"]:
                doc = self.json_event((await self._read(response, request.clock)).decode("utf-8", "replace"))
                if isinstance(doc, dict) and "error" in doc:  # an error in a 200 answer, as in a stream
                    raise http_errors.from_event(self.name, doc, self.trusts_event_status)
                if not isinstance(doc, dict):
                    raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: unexpected answer {str(doc)[:200]}")
                for chunk in answer.read([doc]):
                    yield chunk
            else:
                async for batch in self.json_event_batches(request, response, self.trusts_event_status):
                    for chunk in answer.read(batch):
                        yield chunk
                    if not self.ask_usage and answer.finished():
                        break  # nothing more worth reading: closing also stops the engine
        finally:
            response.release()
        for chunk in answer.ends():
            yield chunk


class _Answer:
    """What ``generate`` tracks of one answer while it arrives: each choice's state and the usage."""

    __slots__ = ("engine", "expected", "request", "states", "stop_texts", "usage")

    def __init__(self, request: GenerationRequest, engine: OpenAICompatBackend) -> None:
        self.request, self.engine = request, engine
        # Engines stop at stop strings, but some stream a stop's first tokens before they see the rest
        # (trtllm-serve), and some stream end-of-turn text (MII, TGI's completions): text that may
        # still become a stop is held back until it is clear, per choice.
        # The client asked vLLM to keep the stop string in the answer: the engine cuts, not the gateway.
        keeps_stop = bool(request.extra) and request.extra.get("include_stop_str_in_output") is True
        self.stop_texts = engine.end_texts if keeps_stop else (*request.stop, *engine.end_texts)
        self.states: dict[int, _ChoiceState] = {}
        self.expected = request.n if engine.capabilities.native_n else 1
        self.usage: Usage | None = None

    def read(self, batch: list[dict[str, Any]]) -> list[Chunk]:
        """The chunks of documents that arrived together (stream chunks, or one whole answer), each but
        the last marked as having company (``Chunk.more``)."""
        out: list[tuple[str, int, tuple[ToolCallDelta, ...], tuple[TokenLogprob, ...]]] = []
        states, stop_texts, top = self.states, self.stop_texts, self.request.top_logprobs
        for doc in batch:
            parsed = parse_chunk(doc)
            if parsed.usage is not None:
                self.usage = add_usage(self.usage, parsed.usage) if self.engine.usage_per_choice else parsed.usage
            for choice in parsed.choices:
                piece = _read_choice(states, choice, stop_texts, top)
                if piece is not None:
                    out.append(piece)
        last = len(out) - 1
        return [Chunk(text, None, None, i < last, index, calls, lps) for i, (text, index, calls, lps) in enumerate(out)]

    def finished(self) -> bool:
        """Every choice has its finish reason (or was cut at a stop)."""
        states = self.states
        return len(states) >= self.expected and all(s.stops.stopped or s.finish is not None for s in states.values())

    def ends(self) -> list[Chunk]:
        """Each choice's last chunk (held text, finish reason; usage on the last), once the answer ended."""
        request, states, expected, name = self.request, self.states, self.expected, self.engine.name
        if not states:
            states[0] = _ChoiceState(self.stop_texts)
        lost = [i for i in range(expected) if i not in states] + sorted(i for i in states if not 0 <= i < expected)
        if lost:  # a choice never answered (or one never asked for): the answer is not the one asked
            what = "never answered" if lost[0] < expected else "never asked for"
            raise BackendError(ErrorKind.PROTOCOL, f"{name}: choice {lost[0]} of n={expected} {what}")
        for state in states.values():
            if state.stops.stopped:
                state.finish = "stop"
            if state.finish is None:
                raise BackendError(ErrorKind.PROTOCOL, f"{name}: stream ended without a finish reason")
        usage = self.usage
        if usage is None:  # the engine never says: count streamed pieces (one a token), estimate the prompt
            pieces = sum(s.pieces for s in states.values())
            usage = Usage(estimate_tokens(message_text(request)), pieces, prompt_estimated=True)
        order = sorted(states)
        ends = []
        for index in order:
            state = states[index]
            # Held text that starts the stop string the engine says it stopped on is not the answer.
            reason = state.stop_reason
            named = reason if isinstance(reason, str) and reason in request.stop else None
            tail = "" if named is not None else state.stops.flush()
            matched = state.stops.matched
            if matched not in request.stop:  # an end-of-turn text, not the client's stop
                matched = named
            stop = matched if state.finish == "stop" else None
            ends.append(Chunk(tail, state.finish, usage if index == order[-1] else None, False, index, (), (), stop))
        return ends


def _read_choice(
    states: dict[int, _ChoiceState], choice: ParsedChoice, stop_texts: tuple[str, ...], top_logprobs: int
) -> tuple[str, int, tuple[ToolCallDelta, ...], tuple[TokenLogprob, ...]] | None:
    """One choice's piece of a chunk, its stop strings cut, into its state; None when nothing of it
    goes to the client."""
    index = choice.index
    state = states.get(index)
    if state is None:
        state = states[index] = _ChoiceState(stop_texts)
    state.finish = choice.finish or state.finish
    if choice.stop_reason is not None:
        state.stop_reason = choice.stop_reason
    stops = state.stops
    if stops.stopped:  # what arrived after the stop is not the answer
        return None
    text = ""
    if choice.text:
        state.pieces += 1
        text = stops.feed(choice.text)
    logprobs = choice.logprobs
    if logprobs:
        logprobs = trimmed(logprobs, top_logprobs)
    if text or choice.tool_calls or logprobs:
        return text, index, choice.tool_calls, logprobs
    return None

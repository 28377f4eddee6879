"""One OpenAI-compatible answer as it arrives: each choice's state, its stop strings cut, and its end.

``OpenAICompatBackend.generate`` is an ``AnswerStream`` (``backends.answer_stream``): it opens the
request, reads the engine's stream (or its whole answer) through ``Answer``, where the documents that
arrived together become ``Chunk``s, and once the stream ended gives each choice's last chunk (held
text, finish reason, the usage on the last). Kept apart from the adapter, which every
OpenAI-compatible engine's adapter subclasses, so that it can be compiled (``pyproject.toml``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from backends.base import (
    BackendError,
    Chunk,
    EngineClock,
    ErrorKind,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.capabilities import Capabilities
from backends.httpclient import Response
from backends.openai_events import lone_text
from backends.openai_wire import ParsedChoice, add_usage, message_text, parse_chunk, trimmed
from backends.text import StopStrings, estimate_tokens


class AnswerEngine(Protocol):
    """What ``Answer`` and ``AnswerStream`` use of the engine's adapter (``OpenAICompatBackend``)."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def usage_per_choice(self) -> bool: ...

    @property
    def end_texts(self) -> tuple[str, ...]: ...

    @property
    def ask_usage(self) -> bool: ...

    @property
    def trusts_event_status(self) -> bool: ...

    def payload(self, request: GenerationRequest) -> dict[str, Any]: ...

    def opened(self, request: GenerationRequest, path: str, payload: dict[str, Any]) -> Awaitable[Response]: ...

    def read_body(self, response: Response, clock: EngineClock | None = None) -> Awaitable[bytes]: ...

    def transport_error(self, exc: Exception) -> BackendError: ...


class _ChoiceState:
    """What ``generate`` tracks for one choice while its stream runs."""

    __slots__ = ("finish", "pieces", "stop_reason", "stops")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = StopStrings(stops)
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.pieces = 0


class Answer:
    """What ``generate`` tracks of one answer while it arrives: each choice's state and the usage."""

    __slots__ = ("engine", "expected", "request", "states", "stop_texts", "usage")

    def __init__(self, request: GenerationRequest, engine: AnswerEngine) -> None:
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

    def read(self, batch: list[Any], ending: bool = False) -> list[Chunk]:
        """The chunks of documents that arrived together (stream chunks, or one whole answer; a ``str``
        is a delta of text alone of choice 0, as ``TextBatches`` reads one), each but
        the last marked as having company (``Chunk.more``), the last too when the answer's end is
        already in hand (``ending``: its last chunks follow at once). Consecutive deltas of text alone
        of one choice become one chunk of several ``pieces``."""
        out: list[_Piece] = []
        states, stop_texts, top = self.states, self.stop_texts, self.request.top_logprobs
        for doc in batch:
            if type(doc) is str:  # a delta of text alone of choice 0, read without its document
                _add_text(out, states, 0, doc, stop_texts)
                continue
            content = lone_text(doc)
            if content is not None:  # most of a stream: no record of the choice, no usage to read
                _add_text(out, states, doc["choices"][0].get("index") or 0, content, stop_texts)
                continue
            parsed = parse_chunk(doc)
            if parsed.usage is not None:
                self.usage = add_usage(self.usage, parsed.usage) if self.engine.usage_per_choice else parsed.usage
            for choice in parsed.choices:
                _read_choice(out, states, choice, stop_texts, top)
        last = len(out) - (0 if ending else 1)
        return [p.chunk(i < last) for i, p in enumerate(out)]

    def texts(self, batch: list[Any]) -> list[str] | None:
        """``read`` of a batch of deltas of text alone of choice 0 (``str``s, as ``TextBatches`` reads
        them) that does not end the answer, as the texts the client gets (stop strings cut; the chunk
        ``read`` would make of them: ``text_chunk``); None, nothing read, for any other batch."""
        for doc in batch:
            if type(doc) is not str:
                return None
        state = _state(self.states, 0, self.stop_texts)
        out: list[str] = []
        for doc in batch:
            text = _fed(state, doc)
            if text:
                out.append(text)
        return out

    @staticmethod
    def text_chunk(texts: list[str]) -> Chunk:
        """The chunk ``read`` makes of a batch that ``texts`` read as ``texts`` (not empty)."""
        if len(texts) == 1:
            return Chunk(texts[0], None, None, False, 0, (), ())
        return Chunk("".join(texts), None, None, False, 0, (), (), None, tuple(texts))

    def finished(self) -> bool:
        """Every choice has its finish reason (or was cut at a stop)."""
        states = self.states
        return len(states) >= self.expected and all(s.stops.stopped or s.finish is not None for s in states.values())

    def ends(self) -> list[Chunk]:
        """Each choice's last chunk (held text, finish reason; usage on the last), once the answer ended:
        each marked as having company (``Chunk.more``), since the stream's end follows at once and a
        writer can send them with it."""
        request, states, expected, name = self.request, self.states, self.expected, self.engine.name
        if not states:
            states[0] = _ChoiceState(self.stop_texts)
        one = expected == 1 and len(states) == 1 and 0 in states  # the usual answer: nothing to sort
        lost = (
            []
            if one
            else [i for i in range(expected) if i not in states] + sorted(i for i in states if not 0 <= i < expected)
        )
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
        order = [0] if one else sorted(states)
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
            ends.append(Chunk(tail, state.finish, usage if index == order[-1] else None, True, index, (), (), stop))
        return ends


class _Piece:
    """What one chunk of a batch will say: its text's deltas, or a delta's tool calls and logprobs."""

    __slots__ = ("calls", "index", "logprobs", "texts")

    def __init__(
        self, text: str, index: int, calls: tuple[ToolCallDelta, ...] = (), logprobs: tuple[TokenLogprob, ...] = ()
    ) -> None:
        self.texts = [text]
        self.index = index
        self.calls = calls
        self.logprobs = logprobs

    def chunk(self, more: bool) -> Chunk:
        texts = self.texts
        if len(texts) == 1:
            return Chunk(texts[0], None, None, more, self.index, self.calls, self.logprobs)
        return Chunk("".join(texts), None, None, more, self.index, (), (), None, tuple(texts))


def _state(states: dict[int, _ChoiceState], index: int, stop_texts: tuple[str, ...]) -> _ChoiceState:
    state = states.get(index)
    if state is None:
        state = states[index] = _ChoiceState(stop_texts)
    return state


def _fed(state: _ChoiceState, text: str) -> str:
    """What goes to the client of a delta of text alone of ``state``'s choice, the delta counted: its stop
    strings cut; "" when nothing does (after the stop, or held in case a stop string begins there)."""
    stops = state.stops
    if stops.stopped:  # what arrived after the stop is not the answer
        return ""
    state.pieces += 1
    return stops.feed(text)


def _add_text(
    out: list[_Piece], states: dict[int, _ChoiceState], index: int, text: str, stop_texts: tuple[str, ...]
) -> None:
    """A delta of text alone, its stop strings cut, into its choice's state and ``out``: with the delta
    before when that was text alone of the same choice."""
    text = _fed(_state(states, index, stop_texts), text)
    if not text:
        return
    if out:
        before = out[-1]
        if before.index == index and not before.calls and not before.logprobs and before.texts[0]:
            before.texts.append(text)
            return
    out.append(_Piece(text, index))


def _read_choice(
    out: list[_Piece],
    states: dict[int, _ChoiceState],
    choice: ParsedChoice,
    stop_texts: tuple[str, ...],
    top_logprobs: int,
) -> None:
    """One choice's piece of a chunk, its stop strings cut, into its state and ``out`` (nothing when
    nothing of it goes to the client)."""
    index = choice.index
    state = _state(states, index, stop_texts)
    state.finish = choice.finish or state.finish
    if choice.stop_reason is not None:
        state.stop_reason = choice.stop_reason
    logprobs, calls = choice.logprobs, choice.tool_calls
    if not logprobs and not calls:
        if choice.text:
            _add_text(out, states, index, choice.text, stop_texts)
        return
    if state.stops.stopped:
        return
    text = ""
    if choice.text:
        state.pieces += 1
        text = state.stops.feed(choice.text)
    if logprobs:
        logprobs = trimmed(logprobs, top_logprobs)
    out.append(_Piece(text, index, calls, logprobs))

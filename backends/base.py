"""The neutral types that cross the gateway/backend boundary, and the Backend protocol.

A backend turns a ``GenerationRequest`` into a stream of ``Chunk``s; a
non-streaming response is that stream collected. Failures are ``BackendError``
with a ``kind``: the gateway renders kinds to OpenAI error JSON in one place,
and dispatch decides from ``retryable`` whether another backend may try.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from backends.request import EngineClock as EngineClock
from backends.request import GenerationRequest as GenerationRequest
from values import value


@value(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    """Prompt tokens the engine found in its prefix cache, when it says (OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``)."""
    prompt_estimated: bool = False
    """``prompt_tokens`` is the adapter's estimate (the engine gave no count): the gateway puts its own
    count there when the model's tokenizer is at hand."""
    completion_estimated: bool = False
    """``completion_tokens`` is the adapter's estimate: the gateway counts the answer's text with the
    model's tokenizer instead when it has one."""
    finish_from_count: bool = False
    """The finish reason was judged from ``completion_tokens`` alone ("length" when it reached
    ``max_tokens``, else "stop"): a gateway that recounts judges it again from its own count."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@value(frozen=True)
class ToolCallDelta:
    """A piece of one tool call, as OpenAI streams them: ``id`` and ``name`` on a call's first piece,
    then fragments of its JSON ``arguments``; ``index`` is the call's place in the answer's list."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@value(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None


@value(frozen=True)
class TokenLogprob:
    """One generated token's log probability and the most likely alternatives at its place."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None
    top: tuple[TopLogprob, ...] = ()


@value(frozen=True)
class Chunk:
    """A piece of the answer: text, and on the last chunk the finish reason and usage.

    ``index`` is the choice it belongs to (``n`` > 1); each choice ends with its own chunk carrying a
    ``finish_reason`` (``"tool_calls"`` when the model called tools), and usage on each choice's last
    chunk counts that choice's completion tokens (prompt tokens are the same for every choice)."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    more: bool = False
    """More chunks that arrived with this one follow at once, or the stream's end does: a consumer may
    hold its write for them (and write what it holds when the stream ends)."""
    index: int = 0
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    """Log probabilities of the tokens behind this chunk's text, when the request asked for them."""
    stop_sequence: str | None = None
    """On a choice's last chunk: the request's stop string that ended the answer, where the gateway or
    the engine matched one (``finish_reason`` is then "stop")."""
    pieces: tuple[str, ...] = ()
    """Text that arrived as several deltas in one read (consecutive events of one choice with text
    alone): the deltas, which ``text`` joins. A stream's writer sends one event per piece, as the
    engine did; the chunk costs the layers between one pass instead of one per delta. Empty: ``text``
    is one delta. Whoever changes ``text`` drops them (``one_by_one`` and ``pieces_of``)."""


def pieces_of(chunk: Chunk) -> tuple[str, ...]:
    """The chunk's deltas when they still make its text (a wrapper that rewrote ``text`` and kept the
    field would leave stale ones: then the text is one delta)."""
    pieces = chunk.pieces
    return pieces if pieces and "".join(pieces) == chunk.text else ()


def one_by_one(chunk: Chunk) -> list[Chunk]:
    """A chunk of several deltas (``pieces``) as one chunk per delta, for a consumer that reads text
    delta by delta (a tool-call parser, a front door's event blocks); any other chunk as it is."""
    pieces = pieces_of(chunk)
    if not pieces:
        return [chunk] if not chunk.pieces else [replace(chunk, pieces=())]
    last = len(pieces) - 1
    return [Chunk(p, None, None, True, chunk.index) for p in pieces[:last]] + [
        replace(chunk, text=pieces[last], pieces=())
    ]


class ErrorKind(enum.Enum):
    CONNECT = "connect"
    TIMEOUT = "timeout"
    OVERLOADED = "overloaded"
    BAD_REQUEST = "bad_request"
    CONTEXT_LENGTH = "context_length"
    UPSTREAM = "upstream"
    PROTOCOL = "protocol"
    INTERNAL = "internal"
    """The gateway's own code failed (an adapter bug): never held against the engine's breaker."""
    CONTENT_REFUSED = "content_refused"
    """The engine (or a guard in front of it) refused the request's content (a content policy):
    another backend of the model would too, another model may not (a fallback, docs/traffic.md)."""


# Whether another backend may be tried after an error of this kind (before the first token).
_RETRYABLE = {
    ErrorKind.CONNECT: True,
    ErrorKind.TIMEOUT: True,
    ErrorKind.OVERLOADED: True,
    ErrorKind.BAD_REQUEST: False,
    ErrorKind.CONTEXT_LENGTH: False,
    ErrorKind.UPSTREAM: True,
    ErrorKind.PROTOCOL: True,
    ErrorKind.INTERNAL: True,
    ErrorKind.CONTENT_REFUSED: False,
}


class BackendError(Exception):
    """An engine failed; ``kind`` says how, for mapping to OpenAI errors and for failover."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.retryable = _RETRYABLE[kind] if retryable is None else retryable
        self.detail = message
        """The whole story for the logs (an engine's own words, hosts and all); ``message`` is what a
        client may read."""
        self.failures: list[tuple[str, BackendError]] = []
        """Set by dispatch on the error it raises: every (backend, error) attempt that failed."""

    @property
    def engine_fault(self) -> bool:
        """The engine or the way to it failed (counts against its circuit breaker); a bad request or
        an overload does not."""
        return self.kind in (ErrorKind.CONNECT, ErrorKind.TIMEOUT, ErrorKind.UPSTREAM, ErrorKind.PROTOCOL)


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Load:
    """Live load as the engine reports it (or as the gateway counts it)."""

    running: int
    waiting: int
    kv_cache_usage: float | None = None


@runtime_checkable
class Backend(Protocol):
    """One engine deployment. ``generate`` is an async generator; closing it cancels the work.

    An adapter also declares ``capabilities`` (``backends.capabilities.Capabilities``, read with
    ``capabilities_of``): a backend without it honours plain text only."""

    name: str

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]: ...

    async def health(self) -> Health: ...

    async def load(self) -> Load | None: ...

    def models(self) -> list[str]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class WholeAnswers(Protocol):
    """Optional: engines whose answer to some requests arrives whole, in one piece at the end (MII REST
    always; Triton's ensemble when the client does not stream). The gateway then waits for the whole
    answer under its answer deadline instead of the first-token one."""

    def answers_whole(self, request: GenerationRequest, whole: bool | None = None) -> bool:
        """Whether ``request`` is answered whole; ``whole``: as if its own ``whole`` were this (the
        gateway asks whether an engine would answer whole a request it did not ask whole, without a
        copy of the request)."""
        ...


@runtime_checkable
class TokenCounting(Protocol):
    """Optional: engines that count what they generated themselves (in-process engines)."""

    generated_tokens: int


@runtime_checkable
class Tokenizing(Protocol):
    """Optional: engines with a tokenize route, which count a request's prompt as they will see it
    (chat rendered with their own template, tools included). Raises ``BackendError`` as ``generate`` does."""

    async def count_prompt(self, request: GenerationRequest) -> int: ...


@runtime_checkable
class KnowsContext(Protocol):
    """Optional: engines that say how many prompt plus answer tokens one request may have, the context
    they were launched with (vLLM's ``--max-model-len``, TGI's ``max_total_tokens``, llama-server's
    slot ``n_ctx``, the in-process engines' ``n_ctx``): None until known. The gateway uses the smaller
    of it and the model entry's ``context``."""

    context_length: int | None


@runtime_checkable
class Resending(Protocol):
    """Optional: engines reached over pooled connections, which count requests written again on a
    fresh connection after a stale one refused the first write (never one the engine may have run)."""

    @property
    def transport_retries(self) -> int: ...

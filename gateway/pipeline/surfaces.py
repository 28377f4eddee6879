"""What the pipeline asks of a front door.

A ``Door`` turns its decoded body into ``Work``: the request as the pipeline carries it, whatever
the door. Work says what routing measures of it (its features), how a target answers it (it is the
dispatch's ``Opening``: generate, or embed) and how the answer reads in the door's shapes (a whole
document, or stream events). Authentication, the model check, tenancy admission, ``choose()``,
refusals, deadlines, dispatch with failover, metrics and logs are the same for every door
(``gateway.pipeline.serve``).

The generation doors (chat, completions, Responses, Messages) share one kind of work
(``gateway.pipeline.generation.Generation``) and differ only in a ``Surface``: its own request body into
one ``GenerationRequest``, and the answer's chunks back into its own documents and stream events.
Embeddings bring their own (``gateway.doors.embeddings``).

A ``Door`` or ``Surface`` is stateless and shared; ``Work`` and an ``Answer`` belong to one request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from backends.base import BackendError, Chunk, EngineClock, GenerationRequest, Usage
from gateway.config import LimitsConfig
from gateway.http.errors import ApiError
from values import value

if TYPE_CHECKING:
    from gateway.fleet.entry import Entry
    from gateway.http.exchange import Exchange
    from gateway.state import Runtime
    from gateway.telemetry.tracing import RequestTrace
    from routing.decisions import Decision
    from routing.types import FleetSnapshot, RequestFeatures


@value(frozen=True)
class Asked:
    """A surface's request, understood: what to generate and how the client wants the answer."""

    gen: GenerationRequest
    stream: bool
    include_usage: bool = False
    caller: dict[str, Any] = field(default_factory=dict)
    """What the client said about itself (logged with the request)."""


class Answer(Protocol):
    """One request's answer in the surface's shapes."""

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        """The complete answer's document and the usage it reports."""
        ...

    def opening(self) -> list[bytes]:
        """Stream events sent before the first chunk's (OpenAI: the assistant role)."""
        ...

    def chunk(self, chunk: Chunk) -> bytes | None:
        """The stream event(s) of one chunk, or None when it carries nothing to send; a chunk of several
        text ``pieces`` is one text event per piece, as the engine sent them (``backends.base.one_by_one``)."""
        ...

    def text_events(self) -> Callable[[list[str]], bytes] | None:
        """A writer of the events of deltas of text alone of choice 0 (one event per text), written
        from the texts without a ``Chunk`` (most of a decode-paced stream's reads are one such delta);
        None where the surface writes every event from its chunk (``chunk`` then)."""
        ...

    def closing(self, usage: Usage | None) -> bytes:
        """The events that end a stream that completed (OpenAI: the usage chunk if asked, ``[DONE]``)."""
        ...

    def failure(self, error: ApiError) -> bytes:
        """The events that end a stream that failed after it began (OpenAI: an error event, ``[DONE]``)."""
        ...


class Surface(Protocol):
    route: str
    """The metrics' and logs' route label."""

    def asked(self, data: Any, limits: LimitsConfig, request_id: str) -> Asked:
        """The decoded JSON body as a generation request; raises ``ApiError`` (400) for a bad one."""
        ...

    def answer(self, asked: Asked, request_id: str) -> Answer: ...

    def error_body(self, error: ApiError) -> bytes:
        """An HTTP error's body in the surface's error shape."""
        ...


class Work(Protocol):
    """One request as the pipeline carries it (and the dispatch's ``Opening`` of it on a target)."""

    trace: RequestTrace | None
    """The request's spans, set by the pipeline when tracing is on: each opening sends its attempt's
    ``traceparent`` to the engine."""

    @property
    def model(self) -> str: ...

    @property
    def events(self) -> Answer | None:
        """A streamed answer's events; None: the answer goes whole (``whole``)."""
        ...

    @property
    def caller(self) -> dict[str, Any]:
        """What the client said about itself (logged with the request)."""
        ...

    @property
    def clock(self) -> EngineClock:
        """The time the request waited on engines (the overhead header leaves it out)."""
        ...

    async def features(
        self, ex: Exchange, rt: Runtime, snapshot: FleetSnapshot, headers: Mapping[str, str]
    ) -> RequestFeatures:
        """What routing measures of the request; raises ``ApiError`` (400) for what none can take."""
        ...

    def admission(self, limits: LimitsConfig) -> tuple[int, int | None]:
        """For tenancy's reservation: the most the answer may take when the request sets no length,
        and the prompt's rough size when it was not counted exactly (None: counted)."""
        ...

    def admitted(self, features: RequestFeatures) -> None:
        """The features tenancy admitted (the key's token limit may bound the answer)."""
        ...

    def refusal(self, decision: Decision) -> ApiError:
        """The client's error when no backend takes the request."""
        ...

    def open_at(self, target: Entry) -> AsyncIterator[Chunk]: ...

    def at_once(self, target: Entry) -> bool: ...

    def reopen(self, target: Entry, error: BackendError) -> AsyncIterator[Chunk] | None: ...

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        """The complete answer's document and the usage it reports."""
        ...


class Door(Protocol):
    @property
    def route(self) -> str:
        """The metrics' and logs' route label."""
        ...

    def understood(self, data: Any, rt: Runtime, request_id: str) -> Work:
        """The decoded JSON body as work; raises ``ApiError`` (400) for a bad one. The pipeline
        refuses a model the configuration does not name."""
        ...

    def error_body(self, error: ApiError) -> bytes:
        """An HTTP error's body in the door's error shape."""
        ...


class UsageTotal:
    """The request's usage from its choices' usage: each choice's completion tokens summed, the
    prompt counted once (an engine answering ``n`` itself reports the total on one choice)."""

    __slots__ = ("_by_choice",)

    def __init__(self) -> None:
        self._by_choice: dict[int, Usage] = {}

    def add(self, chunk: Chunk) -> None:
        if chunk.usage is not None:
            self._by_choice[chunk.index] = chunk.usage

    @property
    def usage(self) -> Usage | None:
        usages = self._by_choice.values()
        if not usages:
            return None
        if len(usages) == 1:
            return next(iter(usages))
        cached = [u.cached_tokens for u in usages if u.cached_tokens is not None]
        return Usage(
            max(u.prompt_tokens for u in usages),
            sum(u.completion_tokens for u in usages),
            max(cached) if cached else None,
        )

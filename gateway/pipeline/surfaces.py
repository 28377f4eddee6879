"""What the pipeline asks of a front door: each API surface (``gateway/doors``) turns its own request
body into one ``GenerationRequest`` and the chunks of the answer back into its own documents and
stream events. Routing, capabilities, dispatch, failover, deadlines, metrics and logs are the same
for every surface (``gateway.pipeline.serve``).

A ``Surface`` is stateless and shared; its ``Answer`` belongs to one request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.base import Chunk, GenerationRequest, Usage
from gateway.config import LimitsConfig
from gateway.http.errors import ApiError


@dataclass(frozen=True, slots=True)
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
        """The stream event(s) of one chunk, or None when it carries nothing to send."""
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

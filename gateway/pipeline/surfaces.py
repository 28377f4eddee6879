"""Front doors: each API surface (OpenAI chat and completions here; others beside them) turns its own
request body into one ``GenerationRequest`` and the chunks of the answer back into its own documents
and stream events. Routing, capabilities, dispatch, failover, deadlines, metrics and logs are the
same for every surface (``gateway.completions``).

A ``Surface`` is stateless and shared; its ``Answer`` belongs to one request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.base import Chunk, GenerationRequest, Usage
from gateway.config import LimitsConfig
from gateway.doors.openai_api import ChatBody, CompletionBody, described, parse_body, to_generation
from gateway.doors.openai_shapes import ResponseShape
from gateway.http.errors import ApiError
from gateway.http.exchange import DONE, event


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


class OpenAIAnswer:
    """Chat and completion documents and SSE chunks (``data: {...}``, then ``data: [DONE]``)."""

    __slots__ = ("shape",)

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        return self.shape.whole(chunks)

    def opening(self) -> list[bytes]:
        return [event(doc) for doc in self.shape.role_chunks()]

    def chunk(self, chunk: Chunk) -> bytes | None:
        doc = self.shape.delta(chunk)
        return None if doc is None else event(doc)

    def closing(self, usage: Usage | None) -> bytes:
        if self.shape.include_usage:
            return event(self.shape.usage_chunk(usage)) + DONE
        return DONE

    def failure(self, error: ApiError) -> bytes:
        return event(error.body()) + DONE


class OpenAISurface:
    """``/v1/chat/completions`` (``chat``) or ``/v1/completions``."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.route = "chat" if chat else "completions"
        self._body: type[ChatBody] | type[CompletionBody] = ChatBody if chat else CompletionBody

    def asked(self, data: Any, limits: LimitsConfig, request_id: str) -> Asked:
        body = parse_body(self._body, data, limits.max_messages, limits.max_stop_chars)
        gen = to_generation(body, request_id, limits.max_tokens, limits.max_messages)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Asked(gen, bool(body.stream), include_usage, described(body))

    def answer(self, asked: Asked, request_id: str) -> OpenAIAnswer:
        return OpenAIAnswer(ResponseShape(self.chat, request_id, asked.gen.model, asked.include_usage, asked.gen.n))

    def error_body(self, error: ApiError) -> bytes:
        return error.json()


CHAT = OpenAISurface(chat=True)
COMPLETIONS = OpenAISurface(chat=False)

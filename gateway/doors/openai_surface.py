"""OpenAI's chat and completions as a ``Surface`` of the generation pipeline: bodies parsed by
``openai_api``, answers rendered by ``openai_shapes``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.base import Chunk, Usage, one_by_one, pieces_of
from gateway.config import LimitsConfig
from gateway.doors.openai_api import ChatBody, CompletionBody, described, parse_body, to_generation
from gateway.doors.openai_shapes import ResponseShape
from gateway.http.errors import ApiError
from gateway.http.exchange import DONE, event
from gateway.pipeline.surfaces import Asked


class OpenAIAnswer:
    """Chat and completion documents and SSE chunks (``data: {...}``, then ``data: [DONE]``)."""

    __slots__ = ("shape",)

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        return self.shape.whole(chunks)

    def opening(self) -> list[bytes]:
        return self.shape.role_events()

    def chunk(self, chunk: Chunk) -> bytes | None:
        if chunk.pieces:  # deltas that arrived together: one event each, as the engine sent them
            shape = self.shape
            pieces = pieces_of(chunk)
            if pieces and shape.chat and chunk.finish_reason is None and not chunk.tool_calls and not chunk.logprobs:
                return shape.text_events(chunk.index, pieces)
            return b"".join([self._one(c) or b"" for c in one_by_one(chunk)]) or None
        return self._one(chunk)

    def _one(self, chunk: Chunk) -> bytes | None:
        shape = self.shape
        said = chunk.text or chunk.finish_reason is not None
        if shape.chat and said and not chunk.tool_calls and not chunk.logprobs:  # most of a stream's chunks
            return shape.plain_event(chunk)
        doc = shape.delta(chunk)
        return None if doc is None else event(doc)

    def text_events(self) -> Callable[[list[str]], bytes] | None:
        shape = self.shape
        return shape.text_list if shape.chat else None

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

"""Anthropic's Messages answer: a Message document, or its stream events.

A stream is ``message_start``, then per content block ``content_block_start``, its
``content_block_delta`` events (``text_delta``, or ``input_json_delta`` for a ``tool_use`` block's
input) and ``content_block_stop``, then ``message_delta`` with the stop reason and the usage, and
``message_stop``. A failure after the stream began ends it with an ``error`` event.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import orjson

from backends.base import Chunk, Usage, one_by_one
from gateway.doors.output_blocks import Block, Blocks, Event, Step
from gateway.http.errors import ApiError
from gateway.pipeline.surfaces import UsageTotal

log = logging.getLogger("enginegate.request")

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


# Anthropic's error types by status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_doc(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}


def usage_doc(usage: Usage | None) -> dict[str, Any]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    out: dict[str, Any] = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
    if usage.cached_tokens is not None:
        out["cache_read_input_tokens"] = usage.cached_tokens
    return out


def error_event(error: ApiError) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(error_doc(error)) + b"\n\n"


def _sse(kind: str, doc: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **doc}) + b"\n\n"


class AnthropicAnswer:
    """One request's Message, whole or streamed."""

    __slots__ = ("_blocks", "id", "model")

    def __init__(self, request_id: str, model: str) -> None:
        safe = _ID_UNSAFE.sub("_", request_id)
        self.id = f"msg_{safe}"
        self.model = model
        self._blocks = Blocks(f"toolu_{safe}")

    def _input(self, block: Block) -> dict[str, Any]:
        try:
            value = json.loads(block.text or "{}")
        except ValueError:
            value = None
        if not isinstance(value, dict):  # the model wrote something that is not an object
            log.warning("a tool call's arguments are not a JSON object", extra={"arguments": block.text[:200]})
            return {}
        return value

    def _content(self, block: Block) -> dict[str, Any]:
        if block.call:
            return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": self._input(block)}
        return {"type": "text", "text": block.text}

    def _message(self, content: list[dict[str, Any]], stop: str | None, usage: Usage | None) -> dict[str, Any]:
        sequence = self._blocks.stop_sequence if stop == "stop_sequence" else None
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": sequence,
            "usage": usage_doc(usage),
        }

    def _stop_reason(self) -> str:
        finish = self._blocks.finish_reason or "stop"
        if finish == "stop" and self._blocks.stop_sequence is not None:
            return "stop_sequence"
        return _STOP_REASONS.get(finish, "end_turn")

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        total = UsageTotal()
        for chunk in chunks:
            total.add(chunk)
        blocks = self._blocks.collect(chunks)
        usage = total.usage
        return self._message([self._content(b) for b in blocks], self._stop_reason(), usage), usage

    def text_events(self) -> None:
        return None  # every delta is a block's event, written from its chunk

    def opening(self) -> list[bytes]:
        return [_sse("message_start", {"message": self._message([], None, None)})]

    def _render(self, ev: Event) -> bytes:
        block = ev.block
        if ev.step is Step.OPEN:
            start: dict[str, Any] = (
                {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
                if block.call
                else {"type": "text", "text": ""}
            )
            return _sse("content_block_start", {"index": block.position, "content_block": start})
        if ev.step is Step.GROW:
            delta = (
                {"type": "input_json_delta", "partial_json": ev.delta}
                if block.call
                else {"type": "text_delta", "text": ev.delta}
            )
            return _sse("content_block_delta", {"index": block.position, "delta": delta})
        return _sse("content_block_stop", {"index": block.position})

    def chunk(self, chunk: Chunk) -> bytes | None:
        if chunk.pieces:  # deltas that arrived together: one event each, as the engine sent them
            return b"".join([self.chunk(c) or b"" for c in one_by_one(chunk)]) or None
        events = self._blocks.feed(chunk)
        if not events:
            return None
        return b"".join(self._render(ev) for ev in events)

    def closing(self, usage: Usage | None) -> bytes:
        out = b"".join(self._render(ev) for ev in self._blocks.finish())
        reason = self._stop_reason()
        sequence = self._blocks.stop_sequence if reason == "stop_sequence" else None
        delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage_doc(usage)}
        return out + _sse("message_delta", delta) + _sse("message_stop", {})

    def failure(self, error: ApiError) -> bytes:
        return error_event(error)

"""The Responses API's answer: a Response object, or its typed stream events.

A stream is ``response.created`` and ``response.in_progress``, then for each output item
``response.output_item.added``, its deltas (``response.output_text.delta`` inside a content part, or
``response.function_call_arguments.delta``), its ``...done`` events and ``response.output_item.done``,
then ``response.completed`` (``response.incomplete`` when the length ran out). A failure after the
stream began sends ``error`` and then ``response.failed``. Each SSE carries ``event:`` and a
``sequence_number``; Responses streams have no ``[DONE]``.
"""

from __future__ import annotations

import base64
import os
import time
from typing import Any

import orjson

from backends.base import Chunk, Usage, one_by_one
from gateway.doors.output_blocks import Block, Blocks, Event, Step
from gateway.http.errors import ApiError
from gateway.pipeline.surfaces import UsageTotal

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# Delta events with ``stream_options.include_obfuscation`` are padded so that the delta and its padding
# together fill a multiple of this many characters: their sizes no longer tell the text's length.
PAD_TO = 32


def obfuscation(delta: str) -> str:
    """Random URL-safe characters that pad ``delta`` to the next multiple of ``PAD_TO`` (at least one)."""
    need = PAD_TO - len(delta) % PAD_TO
    return base64.urlsafe_b64encode(os.urandom(need)).decode()[:need]


def usage_doc(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


class ResponsesAnswer:
    """One request's Response, whole or streamed."""

    __slots__ = ("_blocks", "_seq", "created", "echo", "id", "model", "obfuscate")

    def __init__(self, request_id: str, model: str, echo: dict[str, Any], obfuscate: bool = False) -> None:
        self.id = f"resp_{request_id}"
        self.model = model
        self.echo = echo
        self.obfuscate = obfuscate
        self.created = int(time.time())
        self._blocks = Blocks(request_id)
        self._seq = 0

    # documents

    def _item(self, block: Block, status: str) -> dict[str, Any]:
        if block.call:
            return {
                "type": "function_call",
                "id": f"fc_{self.id[5:]}_{block.position}",
                "call_id": block.call_id,
                "name": block.name,
                "arguments": block.text if status != "in_progress" else "",
                "status": status,
            }
        content = [self._part(block.text)] if status != "in_progress" else []
        return {
            "type": "message",
            "id": f"msg_{self.id[5:]}_{block.position}",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item_status(self) -> str:
        return "incomplete" if self._blocks.finish_reason in _INCOMPLETE else "completed"

    def _response(
        self, status: str, usage: Usage | None = None, error: ApiError | None = None, output: bool = True
    ) -> dict[str, Any]:
        reason = _INCOMPLETE.get(self._blocks.finish_reason or "") if status == "incomplete" else None
        item_status = "incomplete" if status == "failed" else self._item_status()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None if error is None else {"code": error.code or error.type, "message": error.message},
            "incomplete_details": None if reason is None else {"reason": reason},
            "model": self.model,
            "output": [self._item(b, item_status) for b in self._blocks.blocks] if output else [],
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": False,
            "truncation": "disabled",
            "usage": usage_doc(usage),
            **self.echo,
        }

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        total = UsageTotal()
        for chunk in chunks:
            total.add(chunk)
        self._blocks.collect(chunks)
        usage = total.usage
        status = "incomplete" if self._blocks.finish_reason in _INCOMPLETE else "completed"
        return self._response(status, usage), usage

    # stream events

    def _event(self, kind: str, doc: dict[str, Any]) -> bytes:
        doc = {"type": kind, "sequence_number": self._seq, **doc}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(doc) + b"\n\n"

    def text_events(self) -> None:
        return None  # every delta is a block's event, written from its chunk

    def opening(self) -> list[bytes]:
        snapshot = self._response("in_progress", output=False)
        return [
            self._event("response.created", {"response": snapshot}),
            self._event("response.in_progress", {"response": snapshot}),
        ]

    def _render(self, ev: Event) -> bytes:
        block = ev.block
        where: dict[str, Any] = {"output_index": block.position}
        item_id = self._item(block, "in_progress")["id"]
        if ev.step is Step.OPEN:
            out = self._event("response.output_item.added", {**where, "item": self._item(block, "in_progress")})
            if not block.call:
                part = {"item_id": item_id, **where, "content_index": 0, "part": self._part("")}
                out += self._event("response.content_part.added", part)
            return out
        if ev.step is Step.GROW:
            pad = {"obfuscation": obfuscation(ev.delta)} if self.obfuscate else {}
            if block.call:
                return self._event(
                    "response.function_call_arguments.delta", {"item_id": item_id, **where, "delta": ev.delta, **pad}
                )
            return self._event(
                "response.output_text.delta",
                {"item_id": item_id, **where, "content_index": 0, "delta": ev.delta, "logprobs": [], **pad},
            )
        done = self._item(block, self._item_status())
        if block.call:
            args = {"item_id": item_id, **where, "name": block.name, "arguments": block.text}
            out = self._event("response.function_call_arguments.done", args)
        else:
            text = {"item_id": item_id, **where, "content_index": 0, "text": block.text, "logprobs": []}
            out = self._event("response.output_text.done", text)
            part = {"item_id": item_id, **where, "content_index": 0, "part": self._part(block.text)}
            out += self._event("response.content_part.done", part)
        return out + self._event("response.output_item.done", {**where, "item": done})

    def chunk(self, chunk: Chunk) -> bytes | None:
        if chunk.pieces:  # deltas that arrived together: one event each, as the engine sent them
            return b"".join([self.chunk(c) or b"" for c in one_by_one(chunk)]) or None
        events = self._blocks.feed(chunk)
        if not events:
            return None
        return b"".join(self._render(ev) for ev in events)

    def closing(self, usage: Usage | None) -> bytes:
        out = b"".join(self._render(ev) for ev in self._blocks.finish())
        if self._blocks.finish_reason in _INCOMPLETE:
            return out + self._event("response.incomplete", {"response": self._response("incomplete", usage)})
        return out + self._event("response.completed", {"response": self._response("completed", usage)})

    def failure(self, error: ApiError) -> bytes:
        err = self._event("error", {"code": error.code or error.type, "message": error.message, "param": error.param})
        return err + self._event("response.failed", {"response": self._response("failed", error=error)})

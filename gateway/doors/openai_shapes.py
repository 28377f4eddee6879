"""OpenAI response documents, built in one place for whole answers and stream chunks alike.

Choices are keyed by ``Chunk.index`` (``n`` > 1); tool calls arrive as ``ToolCallDelta`` pieces
and leave as OpenAI's ``tool_calls`` (merged in a whole answer, passed on as deltas in a stream:
index, id, type and name first, then argument fragments); log probabilities leave in chat's
``logprobs.content`` form or completions' ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.base import Chunk, TokenLogprob, ToolCallDelta, Usage
from gateway.pipeline.surfaces import UsageTotal
from values.calls import json_dumps, wall_time


def usage_dict(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return out


def _bytes(b: tuple[int, ...] | None) -> list[int] | None:
    return list(b) if b is not None else None


def chat_logprob(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": _bytes(lp.bytes),
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.bytes)} for t in lp.top],
    }


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: str | None = None

    def add(self, chunk: Chunk) -> None:
        if chunk.text:
            self.text.append(chunk.text)
        for d in chunk.tool_calls:
            call = self.calls.get(d.index)
            if call is None:
                call = self.calls[d.index] = {"id": d.id, "type": "function", "function": {"name": "", "arguments": ""}}
            if d.id is not None:
                call["id"] = d.id
            if d.name is not None:
                call["function"]["name"] += d.name
            call["function"]["arguments"] += d.arguments
        if chunk.logprobs:
            self.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            self.finish = chunk.finish_reason


def _completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in lps],
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def _rendered(parts: tuple[bytes, bytes], texts: tuple[str, ...] | list[str]) -> bytes:
    """The text events of ``texts`` from a choice's template (the bytes before and after its text)."""
    before, after = parts
    return b"".join([before + json_dumps(text) + after for text in texts])


def _tool_call_delta(d: ToolCallDelta) -> dict[str, Any]:
    if d.id is not None or d.name is not None:  # a call's first piece names it
        return {
            "index": d.index,
            "id": d.id,
            "type": "function",
            "function": {"name": d.name or "", "arguments": d.arguments},
        }
    return {"index": d.index, "function": {"arguments": d.arguments}}


_HOLE = "\x00enginegate-text\x00"
"""Where a text delta's text goes in its event's template (a NUL cannot come from a model name or id)."""
_HOLE_JSON = json_dumps(_HOLE)


class ResponseShape:
    """Builds the JSON documents of one response, chat or completion, whole or streamed."""

    def __init__(self, chat: bool, request_id: str, model: str, include_usage: bool, n: int = 1) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.created = int(wall_time())
        self.include_usage = include_usage
        self.n = n
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self._offsets: dict[int, int] = {}
        """Completions streams: characters of each choice sent so far (``text_offset``)."""
        self._text_events: dict[int, tuple[bytes, bytes] | None] = {}
        """Chat streams: each choice's event of a text delta, as the bytes before and after the text."""

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        """The whole answer's document, and the usage it reports."""
        choices: dict[int, _Choice] = {}
        total = UsageTotal()
        for chunk in chunks:
            total.add(chunk)
            choice = choices.get(chunk.index)
            if choice is None:
                choice = choices[chunk.index] = _Choice()
            choice.add(chunk)
        docs = [self._whole_choice(i, choices[i]) for i in sorted(choices)]
        usage = total.usage
        doc = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": docs,
            "usage": usage_dict(usage),
            "system_fingerprint": None,
        }
        return doc, usage

    def _whole_choice(self, index: int, c: _Choice) -> dict[str, Any]:
        text = "".join(c.text)
        if not self.chat:
            logprobs = _completion_logprobs(c.logprobs, 0) if c.logprobs else None
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish}
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if c.calls:
            message["tool_calls"] = [c.calls[i] for i in sorted(c.calls)]
            if not text:
                message["content"] = None
        logprobs = {"content": [chat_logprob(lp) for lp in c.logprobs], "refusal": None} if c.logprobs else None
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": c.finish}

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            doc["usage"] = None
        return doc

    def role_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open with the assistant role for each choice, as OpenAI's do."""
        if not self.chat:
            return []
        return [
            self._chunk(
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            )
            for i in range(self.n)
        ]

    def delta(self, chunk: Chunk) -> dict[str, Any] | None:
        if not chunk.text and chunk.finish_reason is None and not chunk.tool_calls and not chunk.logprobs:
            return None
        if self.chat:
            delta: dict[str, Any] = {"content": chunk.text} if chunk.text else {}
            if chunk.tool_calls:
                delta["tool_calls"] = [_tool_call_delta(d) for d in chunk.tool_calls]
            logprobs = (
                {"content": [chat_logprob(lp) for lp in chunk.logprobs], "refusal": None} if chunk.logprobs else None
            )
            return self._chunk(
                {"index": chunk.index, "delta": delta, "logprobs": logprobs, "finish_reason": chunk.finish_reason}
            )
        logprobs = None
        if chunk.logprobs:
            offset = self._offsets.get(chunk.index, 0)
            logprobs = _completion_logprobs(list(chunk.logprobs), offset)
        if chunk.text:
            self._offsets[chunk.index] = self._offsets.get(chunk.index, 0) + len(chunk.text)
        return self._chunk(
            {"index": chunk.index, "text": chunk.text, "logprobs": logprobs, "finish_reason": chunk.finish_reason}
        )

    def text_event(self, index: int, text: str) -> bytes | None:
        """The SSE event of a chat chunk of text alone (most of a stream), byte for byte what
        ``delta`` and ``exchange.event`` make of it, from a template rendered once per choice: one
        ``orjson.dumps`` of the text rather than a document of three dicts per token. None where no
        template can be cut (an id or model holding the placeholder): ``delta`` then."""
        parts = self._text_template(index)
        if parts is None:
            return None
        return parts[0] + json_dumps(text) + parts[1]

    def text_events(self, index: int, texts: tuple[str, ...]) -> bytes | None:
        """``text_event`` of each of ``texts``, in one piece of bytes."""
        parts = self._text_template(index)
        return None if parts is None else _rendered(parts, texts)

    def text_list(self, texts: list[str]) -> bytes:
        """``text_events`` of choice 0 where its template is known to be there (``text_event`` said so)."""
        parts = self._text_events[0]
        if parts is None:
            raise RuntimeError("no text template")
        return _rendered(parts, texts)

    def _text_template(self, index: int) -> tuple[bytes, bytes] | None:
        """Choice ``index``'s text event as the bytes before and after its text, cut once per choice."""
        events = self._text_events
        if index in events:
            return events[index]
        doc = self._chunk({"index": index, "delta": {"content": _HOLE}, "logprobs": None, "finish_reason": None})
        pieces = json_dumps(doc).split(_HOLE_JSON)
        parts = events[index] = (b"data: " + pieces[0], pieces[1] + b"\n\n") if len(pieces) == 2 else None
        return parts

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_dict(usage),
        }

"""OpenAI response documents, built in one place for whole answers and stream chunks alike.

Choices are keyed by ``Chunk.index`` (``n`` > 1); tool calls arrive as ``ToolCallDelta`` pieces
and leave as OpenAI's ``tool_calls`` (merged in a whole answer, passed on as deltas in a stream:
index, id, type and name first, then argument fragments); log probabilities leave in chat's
``logprobs.content`` form or completions' ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, final

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


def _tool_call_delta(d: ToolCallDelta) -> dict[str, Any]:
    if d.id is not None or d.name is not None:  # a call's first piece names it
        return {
            "index": d.index,
            "id": d.id,
            "type": "function",
            "function": {"name": d.name or "", "arguments": d.arguments},
        }
    return {"index": d.index, "function": {"arguments": d.arguments}}


@final
class _ChoiceEvents:
    """A chat stream's plain events of one choice (text, a finish, the role; no tool calls or log
    probabilities) as the bytes around their delta, rendered once per choice: byte for byte the events
    ``delta`` and ``exchange.event`` make of the same chunk, with one ``orjson.dumps`` of a string where
    the document path builds three dicts and dumps them (most of a stream's events are a text alone)."""

    __slots__ = ("between", "head", "quoted_between", "tail", "text_after", "text_before")

    def __init__(self, shape: ResponseShape, index: int) -> None:
        # The document's keys in ``_chunk``'s order, as orjson writes them (compact, strings escaped by it).
        self.head = b"".join((
            b'data: {"id":', json_dumps(shape.id), b',"object":"chat.completion.chunk","created":',
            str(shape.created).encode(), b',"model":', json_dumps(shape.model), b',"choices":[{"index":',
            str(index).encode(), b',"delta":',
        ))  # fmt: skip
        self.tail = b'}],"usage":null}\n\n' if shape.include_usage else b"}]}\n\n"
        self.text_before = self.head + b'{"content":'
        self.text_after = b'},"logprobs":null,"finish_reason":null' + self.tail
        self.between = self.text_after + self.text_before
        """What comes between two texts of a run of text events."""
        self.quoted_between = b'"' + self.between + b'"'
        """What replaces the ``","`` between two strings of a list of them."""

    def texts(self, texts: tuple[str, ...] | list[str]) -> bytes:
        """The text events of ``texts``, in one piece of bytes. A run of texts is encoded as one list (one
        ``orjson.dumps``, about 800 instructions a call, not one per text); where none of them was
        escaped (no backslash in the list), every quote in it is a string's own, so each ``","`` is the
        gap between two texts, where the events' bytes go."""
        if not texts:
            return b""
        if len(texts) == 1:
            return self.text_before + json_dumps(texts[0]) + self.text_after
        encoded = json_dumps(texts)
        if 92 in encoded:  # a backslash, as an int (see ``values.calls``)
            strings = self.between.join([json_dumps(text) for text in texts])
        else:
            strings = encoded[1:-1].replace(b'","', self.quoted_between)
        return b"".join((self.text_before, strings, self.text_after))

    def plain(self, text: str, finish: str | None) -> bytes:
        """The event of a delta of ``text`` (none when empty) and ``finish``."""
        delta = b'{"content":' + json_dumps(text) + b"}" if text else b"{}"
        reason = b"null" if finish is None else json_dumps(finish)
        return self.head + delta + b',"logprobs":null,"finish_reason":' + reason + self.tail

    def role(self) -> bytes:
        return self.head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null' + self.tail


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
        self._events: dict[int, _ChoiceEvents] = {}
        """Chat streams: each choice's plain events, rendered around their delta."""

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

    def role_events(self) -> list[bytes]:
        """Chat streams open with the assistant role for each choice, as OpenAI's do."""
        if not self.chat:
            return []
        return [self._choice(i).role() for i in range(self.n)]

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

    def plain_event(self, chunk: Chunk) -> bytes:
        """The SSE event of a chat chunk of text, a finish or both and nothing else (most of a stream's
        chunks), byte for byte what ``delta`` and ``exchange.event`` make of it, from the choice's
        ``_ChoiceEvents``."""
        return self._choice(chunk.index).plain(chunk.text, chunk.finish_reason)

    def text_events(self, index: int, texts: tuple[str, ...] | list[str]) -> bytes:
        """The events of deltas of ``texts`` alone of choice ``index``, in one piece of bytes."""
        return self._choice(index).texts(texts)

    def text_list(self, texts: list[str]) -> bytes:
        """``text_events`` of choice 0."""
        return self._choice(0).texts(texts)

    def _choice(self, index: int) -> _ChoiceEvents:
        """Choice ``index``'s ``_ChoiceEvents`` (chat streams), made at its first event."""
        events = self._events.get(index)
        if events is None:
            events = self._events[index] = _ChoiceEvents(self, index)
        return events

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_dict(usage),
        }

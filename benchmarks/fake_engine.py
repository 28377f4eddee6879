"""A deliberately fast OpenAI-compatible engine for overhead benchmarks: canned tokens, no model.

    python -m uvicorn benchmarks.fake_engine:app --port 8301 --no-access-log

Streams ``FAKE_TOKENS`` chunks (default 16) to a request that asks for a stream, answers the same text
whole (one JSON body) to one that does not, and answers /health; the gateway's cost is what remains when
the engine costs almost nothing; /v1/models lists ``FAKE_MODEL`` (default ``bench``). (It streamed to
every request until the side-by-side benchmark: a proxy that relays bytes then answered a whole-answer
client with a stream.) With ``FAKE_PACE_MS`` above 0 a stream is decode-paced: one event per write,
that many milliseconds apart, as a real engine sends its tokens (each arrives at a proxy alone).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

TOKENS = int(os.environ.get("FAKE_TOKENS", "16"))
PACE_S = float(os.environ.get("FAKE_PACE_MS", "0")) / 1000
"""Seconds between a stream's events (0: the whole stream in one write)."""
MODEL = os.environ.get("FAKE_MODEL", "bench")
"""The model /v1/models lists (routers such as smg register a worker for the models it lists)."""
MODELS = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "fake"}]})


def _chunk(chat: bool, text: str | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    if usage is not None:
        choices: list[dict[str, Any]] = []
    elif chat:
        choices = [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "finish_reason": finish}]
    doc: dict[str, Any] = {"id": "x", "object": "chunk", "created": 0, "model": "m", "choices": choices}
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _events(chat: bool) -> list[bytes]:
    """A stream's events as a paced engine writes them: each token; the finish, usage and end together."""
    usage = {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": 8 + TOKENS}
    parts = [_chunk(chat, f" tok{i}") for i in range(TOKENS)]
    return [*parts, _chunk(chat, None, "length") + _chunk(chat, None, usage=usage) + b"data: [DONE]\n\n"]


def _whole(chat: bool) -> bytes:
    text = "".join(f" tok{i}" for i in range(TOKENS))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    doc = {
        "id": "x", "object": "chat.completion" if chat else "text_completion", "created": 0, "model": "m",
        "choices": [choice], "usage": {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": 8 + TOKENS},
    }  # fmt: skip
    return orjson.dumps(doc)


EVENTS = {chat: _events(chat) for chat in (True, False)}
BODIES = {chat: b"".join(EVENTS[chat]) for chat in (True, False)}
WHOLE = {chat: _whole(chat) for chat in (True, False)}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more, asked = True, b""
    while more:
        message = await receive()
        asked += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"].endswith("/completions"):
        chat = scope["path"].endswith("/chat/completions")
        if orjson.loads(asked or b"{}").get("stream"):
            if PACE_S > 0:
                await _paced(send, EVENTS[chat])
                return
            body, kind = BODIES[chat], b"text/event-stream"
        else:
            body, kind = WHOLE[chat], b"application/json"
    elif scope["path"] == "/v1/models":
        body, kind = MODELS, b"application/json"
    else:
        body, kind = b"", b"text/plain"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})


async def _paced(send: Any, events: list[bytes]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for i, event in enumerate(events, 1):
        await asyncio.sleep(PACE_S)
        await send({"type": "http.response.body", "body": event, "more_body": i < len(events)})

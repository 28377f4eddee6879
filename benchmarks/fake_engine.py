"""A deliberately fast OpenAI-compatible engine for overhead benchmarks: canned tokens, no model.

    python -m uvicorn benchmarks.fake_engine:app --port 8301 --no-access-log

Streams ``FAKE_TOKENS`` chunks (default 16) per request and answers /health; the gateway's cost is
what remains when the engine costs almost nothing.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

TOKENS = int(os.environ.get("FAKE_TOKENS", "16"))


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


def _body(chat: bool) -> bytes:
    usage = {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": 8 + TOKENS}
    parts = [_chunk(chat, f" tok{i}") for i in range(TOKENS)]
    parts += [_chunk(chat, None, "length"), _chunk(chat, None, usage=usage), b"data: [DONE]\n\n"]
    return b"".join(parts)


BODIES = {chat: _body(chat) for chat in (True, False)}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if scope["path"].endswith("/completions"):
        body, kind = BODIES[scope["path"].endswith("/chat/completions")], b"text/event-stream"
    else:
        body, kind = b"", b"text/plain"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})

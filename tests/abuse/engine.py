"""A fake OpenAI-compatible engine for the abuse probes: streams as long and as slowly as asked,
and counts the streams it is running, so a test sees the engine's work stop, not the gateway's word.
A request without ``stream: true`` is generated at the same pace and answered whole at its end, as
OpenAI-compatible engines do (a client leaving before then still cuts it).

    python -m tests.abuse.engine PORT

The served model name sets the pace: ``tok<BYTES>-<MS>`` streams tokens of BYTES characters every
MS milliseconds (``tok8-0``: tiny tokens as fast as they are read), up to the request's
``max_tokens``. ``GET /stats`` answers ``{"active", "started", "finished", "cut"}`` (``cut``:
streams that ended because the gateway hung up before the last token).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from typing import Any

import orjson
import uvicorn

_MODEL = re.compile(r"^tok(\d+)-(\d+)$")
stats = {"active": 0, "started": 0, "finished": 0, "cut": 0}


def _chunk(text: str | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    delta = {"content": text} if text else {}
    choices = [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    doc: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _whole(text: str, usage: dict[str, int]) -> bytes:
    """A whole chat answer, as an engine answers a request that does not stream."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
    doc = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage}
    return orjson.dumps(doc)


async def _read_body(receive: Any) -> bytes:
    parts = []
    more = True
    while more:
        message = await receive()
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(parts)


async def _stream(receive: Any, send: Any, body: dict[str, Any]) -> None:
    m = _MODEL.match(str(body.get("model", "")))
    size, delay = (int(m.group(1)), int(m.group(2)) / 1000) if m else (8, 0.0)
    tokens = int(body.get("max_tokens") or 16)
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch())
    stats["active"] += 1
    stats["started"] += 1
    sent = 0
    streams = bool(body.get("stream"))
    try:
        if streams:
            start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            await send(start)
        token = "x" * size
        while sent < tokens and not gone.is_set():
            if streams:
                await send({"type": "http.response.body", "body": _chunk(token), "more_body": True})
            sent += 1
            if delay:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), delay)
            else:
                await asyncio.sleep(0)  # let the watcher see a hang-up
        if sent == tokens:
            usage = {"prompt_tokens": 8, "completion_tokens": sent, "total_tokens": 8 + sent}
            if streams:
                tail = _chunk(None, "length") + _chunk(None, usage=usage) + b"data: [DONE]\n\n"
                await send({"type": "http.response.body", "body": tail})
            else:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
                )
                await send({"type": "http.response.body", "body": _whole(token * sent, usage)})
    finally:
        watcher.cancel()
        stats["active"] -= 1
        stats["finished" if sent == tokens else "cut"] += 1


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    raw = await _read_body(receive)
    if scope["path"].endswith("/completions"):
        await _stream(receive, send, orjson.loads(raw))
        return
    body = orjson.dumps(stats) if scope["path"] == "/stats" else b""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)

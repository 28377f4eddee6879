"""The floor of a Python gateway on enginegate's own stack: what a proxy that does nothing else costs.

uvicorn (httptools, uvloop: what ``enginegate serve`` runs) and the project's engine client
(``backends.httpclient``), with nothing between them: the body is read, its JSON parsed (a gateway
must at least read ``model`` and ``stream``), the same bytes sent to the one upstream, and the
answer relayed as it comes (a whole body, or each streamed chunk as it arrives). No routing, no
limits, no metrics, no translation, no accounting: none of enginegate's features. The side-by-side
benchmark runs it as ``python-floor`` (``benchmarks/peers.py``) so that the CPU per request any
Python design on this stack could reach is measured in the same run as the Rust routers'.

    ENGINE_URL=http://127.0.0.1:8301 uvicorn benchmarks.floor_proxy:app --port 8401 --no-access-log

Not a way to serve: it answers every path with the upstream's chat completions.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from backends.httpclient import HttpClient

ENGINE = os.environ.get("ENGINE_URL", "http://127.0.0.1:8301")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Floor:
    """The ASGI app: one POST in, one POST to the engine, its answer out."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.client: HttpClient | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            self.client = HttpClient(self.engine, max_connections=1024)
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        stream = bool(orjson.loads(body).get("stream"))
        response = await self.client.request("POST", "/v1/chat/completions", body)
        if not stream:
            data = await response.read()
            response.release()
            await send({"type": "http.response.start", "status": response.status, "headers": _JSON})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": response.status, "headers": _SSE})
        while chunk := await response.read_chunk():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        response.release()
        await send({"type": "http.response.body", "body": b""})


app = Floor(ENGINE)

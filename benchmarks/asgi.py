"""The gateway's ASGI app driven in process, with no sockets: its lifespan, and one POST at a time
(``benchmarks/inprocess.py``, ``benchmarks/layers.py`` and the unit tests that count frames)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from backends.base import Chunk, GenerationRequest, Health, Load, Usage

CONFIG = (
    "models: [{name: m, params_b: 8}]\n"
    "backends: [{name: b, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}]\n"
)
"""One model ``m`` on one backend ``b``: the app's engine factory decides what ``b`` is."""


class Fast:
    """An engine that answers at once: ``tokens`` chunks of one token each, then the finish."""

    def __init__(self, name: str, model: str, tokens: int = 16) -> None:
        self.name, self._model = name, model
        self.tokens = tokens

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for _ in range(self.tokens):
            yield Chunk(text=" tok")
        yield Chunk(finish_reason="stop", usage=Usage(5, self.tokens))

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return None

    def models(self) -> list[str]:
        return [self._model]

    async def aclose(self) -> None:
        return None


async def started(app: Any) -> asyncio.Task[None]:
    """Run the app's lifespan until startup completes (the fleet has polled its backends)."""
    lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await lifespan.put({"type": "lifespan.startup"})
    ready = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            ready.set()

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    task: asyncio.Task[None] = asyncio.ensure_future(app(scope, lifespan.get, lifespan_send))
    await ready.wait()
    return task


async def post(app: Any, path: str, body: bytes, out: list[bytes] | None = None) -> int:
    """POST ``body`` to ``path`` from a client that stays; the response's status (its body into ``out``)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif out is not None:
            out.append(message["body"])

    headers = [(b"content-type", b"application/json"), (b"host", b"localhost"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b"",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "scheme": "http", "http_version": "1.1",
        "root_path": "",
    }  # fmt: skip
    await app(scope, receive, send)
    return status[0]

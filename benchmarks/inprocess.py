"""Gateway CPU per request with no network: the ASGI app driven directly, a scripted engine answering
16 tokens at once; chat, whole and streamed. Isolates the gateway's own work from wrk, sockets and
process wake-ups (``benchmarks/overhead.py`` measures all of it together).

    python benchmarks/inprocess.py                 # this tree
    PYTHONPATH=/path/to/other/tree python benchmarks/inprocess.py   # another checkout, same venv

Prints the best-of-five CPU microseconds per request (1,000 requests each) as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

# The tree's packages, not this folder's scripts (benchmarks/routing.py would shadow routing/). A
# PYTHONPATH given on the command line still comes first.
sys.path.remove(str(Path(__file__).resolve().parent))
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

from backends.base import Chunk, GenerationRequest, Health, Load, Usage
from gateway.app import create_app
from gateway.config import load_config

REPEATS, REQUESTS, WARMUP = 5, 1000, 300


class Fast:
    """An engine that answers at once."""

    def __init__(self, name: str, model: str) -> None:
        self.name, self._model = name, model

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for _ in range(16):
            yield Chunk(text=" tok")
        yield Chunk(finish_reason="stop", usage=Usage(5, 16))

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return None

    def models(self) -> list[str]:
        return [self._model]

    async def aclose(self) -> None:
        return None


def _app() -> Any:
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    config.write_text(
        "models: [{name: m, params_b: 8}]\n"
        "backends: [{name: b, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}]\n"
    )
    return create_app(load_config(config), lambda cfg, loaded: Fast(cfg.name, cfg.model))


async def _one(app: Any, stream: bool) -> None:
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 16, "stream": stream}
    )
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

    headers = [(b"content-type", b"application/json"), (b"host", b"localhost"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers, "query_string": b"",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "scheme": "http", "http_version": "1.1",
        "root_path": "",
    }  # fmt: skip
    await app(scope, receive, send)
    assert status == [200], status


async def main() -> None:
    app = _app()
    lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await lifespan.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.get, lifespan_send))
    await started.wait()
    for _ in range(WARMUP):
        await _one(app, False)
        await _one(app, True)
    best: dict[str, float] = {}
    for stream in (False, True):
        runs = []
        for _ in range(REPEATS):
            t = time.process_time()
            for _ in range(REQUESTS):
                await _one(app, stream)
            runs.append((time.process_time() - t) / REQUESTS * 1e6)
        best["stream_us" if stream else "whole_us"] = round(min(runs), 1)
    import gateway.app

    print(json.dumps({"tree": str(Path(gateway.app.__file__).parents[1]), **best}))
    task.cancel()
    os._exit(0)  # the fleet's poller and the app's lifespan need no orderly end here


if __name__ == "__main__":
    asyncio.run(main())

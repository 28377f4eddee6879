"""Stacked async generators and coroutine resumptions per streamed chunk, through the in-process app.

One streamed chat request against an engine that yields its chunks one by one; ``sys.setprofile``
sees every resumption of a generator or coroutine frame (a ``call`` event) and, at each chunk the
engine yields, the stack of generator and coroutine frames above it. Resumptions per chunk are the
difference between a long answer and a short one, divided by the chunks between them, so the
request's fixed work (body, routing, headers) cancels out.

    PYTHONPATH=$PWD python benchmarks/layers.py   # JSON: the frames over a chunk, resumptions and calls per chunk
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import tempfile
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

sys.path.remove(str(Path(__file__).resolve().parent))  # benchmarks/routing.py would shadow routing/
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

from backends.base import Chunk, GenerationRequest, Health, Load, Usage
from gateway.app import create_app
from gateway.config import load_config

SHORT, LONG = 8, 208
SUSPENDING = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class Chunks:
    """An engine that streams ``chunks`` tokens, each its own chunk (nothing arrives together)."""

    chunks = SHORT

    def __init__(self, name: str, model: str) -> None:
        self.name, self._model = name, model

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for _ in range(Chunks.chunks):
            yield Chunk(text=" tok")
        yield Chunk(finish_reason="stop", usage=Usage(5, Chunks.chunks))

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return None

    def models(self) -> list[str]:
        return [self._model]

    async def aclose(self) -> None:
        return None


GENERATE = Chunks.generate.__code__


class Counter:
    def __init__(self) -> None:
        self.resumptions = 0
        self.calls = 0
        self.stacks: list[list[str]] = []

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.calls += 1
            if frame.f_code.co_flags & SUSPENDING:
                self.resumptions += 1
        elif event == "return" and frame.f_code is GENERATE and arg is not None:  # the engine yields a chunk
            stack, f = [], frame.f_back
            while f is not None:
                if f.f_code.co_flags & SUSPENDING:
                    kind = "agen" if f.f_code.co_flags & inspect.CO_ASYNC_GENERATOR else "coro"
                    stack.append(f"{kind} {f.f_code.co_qualname}")
                f = f.f_back
            self.stacks.append(stack)


async def _one(app: Any) -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hello"}], "stream": True})
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


async def _counted(app: Any, chunks: int) -> Counter:
    Chunks.chunks = chunks
    counter = Counter()
    sys.setprofile(counter)
    try:
        await _one(app)
    finally:
        sys.setprofile(None)
    return counter


async def main() -> None:
    config = Path(tempfile.mkdtemp()) / "layers.yaml"
    config.write_text(
        "models: [{name: m, params_b: 8}]\n"
        "backends: [{name: b, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}]\n"
    )
    app = create_app(load_config(config), lambda cfg, loaded: Chunks(cfg.name, cfg.model))
    lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await lifespan.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.get, lifespan_send))
    await started.wait()
    for _ in range(3):  # warm: first-request caches, lazy imports
        await _one(app)
    short, long = await _counted(app, SHORT), await _counted(app, LONG)
    stack = long.stacks[len(long.stacks) // 2]  # a chunk in the middle of the stream
    stack = stack[: next((i for i, s in enumerate(stack) if s.endswith("RequestLife.run")), len(stack))]
    print(
        json.dumps(
            {
                "layers": len(stack) + 1,  # the engine's generator, then the pipeline's frames over it
                "async_generators": 1 + sum(1 for s in stack if s.startswith("agen")),
                "resumptions_per_chunk": round((long.resumptions - short.resumptions) / (LONG - SHORT), 2),
                "python_calls_per_chunk": round((long.calls - short.calls) / (LONG - SHORT), 2),
                "stack": stack,
            },
            indent=1,
        )
    )
    task.cancel()
    os._exit(0)  # the fleet's poller and the app's lifespan need no orderly end here


if __name__ == "__main__":
    asyncio.run(main())

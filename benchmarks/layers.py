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
from pathlib import Path
from typing import Any

import orjson

sys.path.remove(str(Path(__file__).resolve().parent))  # benchmarks/routing.py would shadow routing/
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

from benchmarks.asgi import CONFIG, Fast, post, started
from gateway.app import create_app
from gateway.config import load_config

SHORT, LONG = 8, 208
SUSPENDING = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


GENERATE = Fast.generate.__code__


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
    status = await post(app, "/v1/chat/completions", body)
    assert status == 200, status


async def _counted(app: Any, engine: Fast, chunks: int) -> Counter:
    engine.tokens = chunks
    counter = Counter()
    sys.setprofile(counter)
    try:
        await _one(app)
    finally:
        sys.setprofile(None)
    return counter


async def main() -> None:
    config = Path(tempfile.mkdtemp()) / "layers.yaml"
    config.write_text(CONFIG)
    engine = Fast("b", "m", SHORT)  # each token its own chunk: nothing arrives together
    app = create_app(load_config(config), lambda cfg, loaded: engine)
    task = await started(app)
    for _ in range(3):  # warm: first-request caches, lazy imports
        await _one(app)
    short, long = await _counted(app, engine, SHORT), await _counted(app, engine, LONG)
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

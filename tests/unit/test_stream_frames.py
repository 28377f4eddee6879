"""A streamed chunk goes from the engine's generator to the socket with no generator between them:
the pipeline's ``_stream`` reads the committed answer and writes it itself (``benchmarks/layers.py``
measures the same stack and the resumptions per chunk)."""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from backends.base import Chunk, GenerationRequest, Usage
from benchmarks.asgi import CONFIG, post, started
from gateway.app import create_app
from gateway.config import load_config
from gateway.pipeline import serve
from tests.compiled import interpreted_only
from tests.fakes import ScriptedBackend, factory

SUSPENDING = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class Engine(ScriptedBackend):
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for word in self.words:
            yield Chunk(text=word)
        yield Chunk(finish_reason="stop", usage=Usage(3, len(self.words)))


async def _streamed(app: Any) -> bytes:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    lifespan = await started(app)  # the fleet has polled its backends: b is healthy
    out: list[bytes] = []
    assert await post(app, "/v1/chat/completions", body, out) == 200
    lifespan.cancel()
    return b"".join(out)


@interpreted_only(serve, "compiled functions have no Python frames to walk")
def test_no_generator_stands_between_the_engine_and_the_socket(tmp_path: Path) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(CONFIG)
    engine = Engine("b", "m", words=["one", " two", " three"])
    app = create_app(load_config(config), factory({"b": engine}))
    stacks: list[list[str]] = []

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "return" and frame.f_code is Engine.generate.__code__ and arg is not None:
            stack, f = [], frame.f_back
            while f is not None and f.f_code.co_qualname != "RequestLife.run":
                if f.f_code.co_flags & SUSPENDING:
                    stack.append(f.f_code.co_qualname)
                f = f.f_back
            stacks.append(stack)

    sys.setprofile(profile)
    try:
        sent = asyncio.run(_streamed(app))
    finally:
        sys.setprofile(None)
    assert sent.count(b"data: ") == 6  # the role, three words, the finish, [DONE]
    # dispatch reads to the commit point (on the request's model, or a fallback's: gateway/pipeline/fallback.py)
    assert stacks[0] == ["_head", "_attempt", "start", "_dispatch", "_on_model", "_serve"]
    assert stacks[1:] == [["_stream", "_serve"]] * 3  # then the stream is read where it is written

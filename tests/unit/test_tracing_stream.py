"""A traced stream's chunks pass through the request's trace, which counts them; closing what the trace
hands back must close the engine's stream even when nobody read from it (the client left before the
first write): that is how the engine learns to stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from backends.base import Chunk, Usage
from gateway.config import TelemetryConfig, VLLMConfig
from gateway.telemetry.tracing import Tracing


def test_closing_an_unread_traced_stream_closes_the_engines_stream() -> None:
    closed: list[bool] = []

    async def engine() -> AsyncIterator[Chunk]:
        try:
            yield Chunk(text="a")
            yield Chunk(finish_reason="stop", usage=Usage(1, 2))
        finally:
            closed.append(True)

    async def run() -> None:
        tracing = Tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9", export_delay_s=60))
        config = VLLMConfig(name="b", engine="vllm", url="http://10.0.0.1:8000", model="m")
        try:
            read = tracing.request({}, "r1", "chat", "/v1/chat/completions", 0.0)
            stream = engine()
            await anext(stream)  # the head dispatch read up to the commit point
            rest = read.committed("b", config, [Chunk(text="h")], stream, True)
            assert [c.finish_reason async for c in rest] == ["stop"]
            assert read.chunks == 2 and read.finishes == ["stop"]

            unread = tracing.request({}, "r2", "chat", "/v1/chat/completions", 0.0)
            stream = engine()
            await anext(stream)
            rest = unread.committed("b", config, [Chunk(text="h")], stream, True)
            closed.clear()
            await rest.aclose()  # type: ignore[attr-defined]
            assert closed == [True]
        finally:
            tracing.provider.shutdown()

    asyncio.run(run())

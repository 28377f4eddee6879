"""Events an engine sent together are forwarded together: the OpenAI-compatible adapter marks chunks
that arrived in one network read, and the gateway writes their SSE events in one piece (each event
unchanged), while events that arrive apart still go out at once."""

from __future__ import annotations

import asyncio

import orjson

from backends.base import GenerationRequest
from backends.http_base import HttpSettings
from backends.vllm import VLLMBackend
from tests.conftest import free_port


def sse(*texts: str, finish: str | None = None) -> bytes:
    out = b""
    for text in texts:
        out += b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"
    if finish:
        doc = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": None}
        out += b"data: " + orjson.dumps(doc) + b"\n\ndata: [DONE]\n\n"
    return out


def test_chunks_from_one_read_are_marked_and_later_ones_are_not() -> None:
    async def scenario() -> list[tuple[str, bool]]:
        # Each later write waits until the client has read what came before: separate reads, however busy.
        read = {text: asyncio.Event() for text in ("c", "d")}

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            writer.write(head + sse("a", "b", "c"))  # three events in one write
            await writer.drain()
            await read["c"].wait()
            writer.write(sse("d"))
            await writer.drain()
            await read["d"].wait()
            writer.write(sse(finish="stop"))
            await writer.drain()
            writer.close()

        port = free_port()
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        backend = VLLMBackend("v", "m", HttpSettings(url=f"http://127.0.0.1:{port}", served_model="m"))
        try:
            request = GenerationRequest("r", "m", messages=[{"role": "user", "content": "hi"}])
            chunks = []
            async for c in backend.generate(request):
                chunks.append((c.text, c.more))
                if c.text in read:
                    read[c.text].set()
            return chunks
        finally:
            await backend.aclose()
            server.close()
            await server.wait_closed()

    chunks = asyncio.run(scenario())
    assert chunks[:4] == [("a", True), ("b", True), ("c", False), ("d", False)]
    assert chunks[-1][1] is False

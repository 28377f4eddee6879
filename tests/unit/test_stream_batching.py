"""Events an engine sent together are forwarded together: the OpenAI-compatible adapter marks chunks
that arrived in one network read (``Chunk.more``), joins consecutive deltas of text alone into one chunk
of several ``pieces``, and the gateway writes their SSE events in one piece (one event per delta, as
the engine sent them), with the stream's end when that came in the same read, while events that arrive
apart still go out at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from backends.base import GenerationRequest
from backends.http_base import HttpSettings
from backends.vllm import VLLMBackend
from benchmarks.asgi import CONFIG, post, started
from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import free_port
from tests.fakes import factory, sse_engine


def sse(*texts: str, finish: str | None = None) -> bytes:
    out = b""
    for text in texts:
        out += b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"
    if finish:
        doc = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": None}
        out += b"data: " + orjson.dumps(doc) + b"\n\ndata: [DONE]\n\n"
    return out


def test_chunks_from_one_read_are_marked_and_later_ones_are_not() -> None:
    async def scenario() -> list[tuple[str, bool, tuple[str, ...]]]:
        # Each later write waits until the client has read what came before: separate reads, however busy.
        read = {text: asyncio.Event() for text in ("abc", "d")}

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            writer.write(head + sse("a", "b", "c"))  # three events in one write
            await writer.drain()
            await read["abc"].wait()
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
                chunks.append((c.text, c.more, c.pieces))
                if c.text in read:
                    read[c.text].set()
            return chunks
        finally:
            await backend.aclose()
            server.close()
            await server.wait_closed()

    chunks = asyncio.run(scenario())
    assert chunks[:2] == [("abc", False, ("a", "b", "c")), ("d", False, ())]
    assert chunks[-1][1] is True  # the stream's end follows the finish at once


def test_a_stream_that_arrives_whole_is_marked_to_its_end_and_written_once(tmp_path: Path) -> None:
    """Every chunk of an answer whose end came in the same read has company, its last chunk too (the
    stream's end follows at once): the client gets the head, the events and [DONE] in one write."""
    body = sse("a", "b", "c", finish="stop")

    async def scenario() -> tuple[list[tuple[str, bool, tuple[str, ...]]], list[bytes]]:
        server, url = await sse_engine([body])  # every answer in one write
        backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m"))
        try:
            request = GenerationRequest("r", "m", messages=[{"role": "user", "content": "hi"}])
            marks = [(c.text, c.more, c.pieces) async for c in backend.generate(request)]
            config = tmp_path / "g.yaml"
            config.write_text(CONFIG)
            app = create_app(load_config(config), factory({"b": backend}))
            lifespan = await started(app)
            asked = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
            writes: list[bytes] = []
            assert await post(app, "/v1/chat/completions", asked, writes) == 200
            lifespan.cancel()
            return marks, writes
        finally:
            await backend.aclose()
            server.close()

    marks, writes = asyncio.run(scenario())
    assert marks == [("abc", True, ("a", "b", "c")), ("", True, ())]
    assert len(writes) == 1, writes
    assert writes[0].count(b"data: ") == 6 and writes[0].endswith(b"data: [DONE]\n\n")  # 3 texts, role, finish, [DONE]
    texts = [orjson.loads(e[6:])["choices"][0]["delta"].get("content") for e in writes[0].split(b"\n\n")[1:4]]
    assert texts == ["a", "b", "c"]  # one event per delta, in order

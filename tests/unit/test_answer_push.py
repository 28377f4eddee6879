"""Chunks pushed to a reader in the engine connection's callback (``AnswerStream.push_to``): a stream
paced by the engine's decoding gives most of its chunks to the sink while the reader's task stays
parked, and the reader still gets exactly the chunks, in the order, and the failures, that it gets
reading every chunk itself."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from backends.answer_stream import AnswerStream
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.http_base import HttpSettings
from backends.openai_answer import Answer
from backends.vllm import VLLMBackend
from benchmarks.asgi import CONFIG
from gateway.app import create_app
from gateway.config import load_config
from gateway.http import exchange
from tests.compiled import interpreted_only
from tests.fakes import factory, serve_in_thread, sse_engine
from tests.polling import wait_until

TEXTS = [f" tok{i}" for i in range(12)]


def _event(choices: list[object], usage: dict[str, int] | None = None) -> bytes:
    doc: dict[str, object] = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + orjson.dumps(doc | {"choices": choices} | ({"usage": usage} if usage else {})) + b"\n\n"


def _text(text: str) -> bytes:
    return _event([{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])


END = [
    _event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]),
    _event([], {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}),
    b"data: [DONE]\n\n",
]
STREAM = [_text(t) for t in TEXTS] + END
ERROR = b'data: {"error":{"message":"engine fell over","type":"internal_error","code":500}}\n\n'


async def _read(
    pieces: list[bytes],
    sink: Callable[[Chunk], bool] | None,
    pace_s: float = 0.005,
    read_timeout_s: float = 30,
    texts: Callable[[list[str]], bool] | None = None,
    stop: list[str] | None = None,
) -> tuple[list[tuple[str, Chunk]], BaseException | None]:
    """Each chunk with where it came from (``sink``, ``texts`` as the chunk of its texts, or ``next``),
    and what the reading raised."""
    server, url = await sse_engine(pieces, pace_s)
    backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m", read_timeout_s=read_timeout_s))
    got: list[tuple[str, Chunk]] = []
    raised: BaseException | None = None
    try:
        request = GenerationRequest(
            request_id="r", model="m", messages=[{"role": "user", "content": "Hi"}], stop=tuple(stop or ())
        )
        stream = backend.generate(request)
        assert isinstance(stream, AnswerStream)
        if sink is not None:

            def recorded(chunk: Chunk) -> bool:
                if not sink(chunk):
                    return False
                got.append(("sink", chunk))
                return True

            def recorded_texts(given: list[str]) -> bool:
                if texts is None or not texts(given):
                    return False
                got.append(("texts", Answer.text_chunk(given)))
                return True

            stream.push_to(recorded, None if texts is None else recorded_texts)
        try:
            async for chunk in stream:
                got.append(("next", chunk))
        except Exception as exc:
            raised = exc
        finally:
            await stream.aclose()
    finally:
        await backend.aclose()
        server.close()
    return got, raised


def _texts(got: list[tuple[str, Chunk]]) -> list[str]:
    return [c.text for _, c in got if c.text]


def test_a_paced_stream_is_pushed_and_reads_as_it_would_be_read() -> None:
    pulled, error = asyncio.run(_read(STREAM, None))
    assert error is None and {how for how, _ in pulled} == {"next"}
    pushed, error = asyncio.run(_read(STREAM, lambda chunk: True))
    assert error is None
    assert [c for _, c in pushed] == [c for _, c in pulled]
    assert _texts(pushed) == TEXTS
    # The first chunk is the reader's own (it is not yet waiting); of the rest, nearly all are pushed
    assert len([how for how, _ in pushed if how == "sink"]) >= len(TEXTS) - 3, pushed


def test_reads_of_text_alone_go_to_the_texts_sink_as_the_chunks_they_would_be() -> None:
    pulled, error = asyncio.run(_read(STREAM, None))
    assert error is None
    pushed, error = asyncio.run(_read(STREAM, lambda chunk: True, texts=lambda texts: True))
    assert error is None
    assert [c for _, c in pushed] == [c for _, c in pulled]
    # Each paced text is a read of its own: nearly all go as texts; the finish and usage as chunks
    assert len([how for how, _ in pushed if how == "texts"]) >= len(TEXTS) - 3, pushed
    assert {how for how, c in pushed if c.finish_reason is not None} == {"next"}


def test_texts_the_sink_declines_come_from_the_reader_as_their_chunk() -> None:
    calls: list[list[str]] = []

    def every_other(texts: list[str]) -> bool:
        calls.append(texts)
        return len(calls) % 2 == 0

    pulled, _ = asyncio.run(_read(STREAM, None))
    got, error = asyncio.run(_read(STREAM, lambda chunk: True, texts=every_other))
    assert error is None
    assert [c for _, c in got] == [c for _, c in pulled]
    assert {how for how, _ in got} >= {"texts", "next"}


def test_texts_stop_at_a_stop_string_as_chunks_do() -> None:
    pulled, error = asyncio.run(_read(STREAM, None, stop=[" tok5"]))
    assert error is None and _texts(pulled) == TEXTS[:5]
    pushed, error = asyncio.run(_read(STREAM, lambda chunk: True, texts=lambda texts: True, stop=[" tok5"]))
    assert error is None
    assert [c for _, c in pushed] == [c for _, c in pulled]
    assert pushed[-1][1].finish_reason == "stop" and pushed[-1][1].stop_sequence == " tok5"


def test_what_the_texts_sink_raises_comes_out_of_the_reader() -> None:
    def failing(texts: list[str]) -> bool:
        if " tok4" in texts:
            raise RuntimeError("the writer broke")
        return True

    got, error = asyncio.run(_read(STREAM, lambda chunk: True, texts=failing))
    assert isinstance(error, RuntimeError) and str(error) == "the writer broke"
    assert " tok4" not in _texts(got)


def test_a_chunk_the_sink_declines_comes_from_the_reader_in_its_place() -> None:
    seen: list[str] = []

    def every_other(chunk: Chunk) -> bool:
        seen.append(chunk.text)
        return len(seen) % 2 == 0

    got, error = asyncio.run(_read(STREAM, every_other))
    assert error is None
    assert _texts(got) == TEXTS
    hows = {how for how, _ in got}
    assert hows == {"sink", "next"}


def test_what_the_sink_raises_comes_out_of_the_reader() -> None:
    def failing(chunk: Chunk) -> bool:
        if chunk.text == " tok4":
            raise RuntimeError("the writer broke")
        return True

    got, error = asyncio.run(_read(STREAM, failing))
    assert isinstance(error, RuntimeError) and str(error) == "the writer broke"
    assert _texts(got) == TEXTS[:4]


@pytest.mark.parametrize("push", [False, True])
def test_an_error_event_while_pushing_fails_the_reader_after_what_came_before(push: bool) -> None:
    got, error = asyncio.run(_read([_text(t) for t in TEXTS[:6]] + [ERROR], (lambda chunk: True) if push else None))
    assert isinstance(error, BackendError), error
    assert _texts(got) == TEXTS[:6]


def test_a_pushed_stream_keeps_its_read_deadline_per_silence() -> None:
    """Pushes move the read deadline: a stream longer than the read timeout, an event every tick,
    is read whole; the engine's silence after some events times out."""
    got, error = asyncio.run(_read(STREAM, lambda chunk: True, pace_s=0.05, read_timeout_s=0.3))
    assert error is None and _texts(got) == TEXTS  # 16 events over 0.8 s, each within 0.3 s
    stalled = [_text(t) for t in TEXTS[:3]] + [b": then silence\n\n"] * 2

    async def hung() -> tuple[list[tuple[str, Chunk]], BaseException | None]:
        return await _read(stalled, lambda chunk: True, pace_s=2.0, read_timeout_s=0.3)

    got, error = asyncio.run(hung())
    assert isinstance(error, BackendError) and error.kind is ErrorKind.TIMEOUT, error
    assert _texts(got) == TEXTS[:1]


def test_a_body_that_ends_without_done_ends_the_pushed_stream() -> None:
    """An engine that never sends ``[DONE]``: the read that completes the body wakes the reader (a
    sink that took it would leave the reader waiting for bytes that never come)."""
    pieces = [_text(t) for t in TEXTS[:4]] + [END[0]]
    got, error = asyncio.run(_read(pieces, lambda chunk: True, read_timeout_s=2))
    assert error is None, error
    assert _texts(got) == TEXTS[:4] and got[-1][1].finish_reason == "stop"


@interpreted_only(exchange, "counts the stream task's own writes by patching Exchange.stream")
def test_a_client_that_reads_slowly_gets_every_event_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a client that stops reading, the gateway's writes pause: pushed chunks then go back to
    the stream's task, which waits for the drain (counted), and pushing resumes after. Every event
    arrives, in order, however the two took turns."""
    by_task: list[int] = []
    write = exchange.Exchange.stream

    async def counted(self: exchange.Exchange, data: bytes) -> None:
        by_task.append(len(data))
        await write(self, data)

    monkeypatch.setattr(exchange.Exchange, "stream", counted)
    texts = [f" {i:04d}" + "x" * 8000 for i in range(1000)]  # 8 MB: more than the kernel's buffers hold
    pieces = [_text(t) for t in texts] + END
    loop = asyncio.new_event_loop()
    engine = threading.Thread(target=loop.run_forever, daemon=True)
    engine.start()
    server, url = asyncio.run_coroutine_threadsafe(sse_engine(pieces), loop).result(10)
    try:
        config = tmp_path / "g.yaml"
        config.write_text(CONFIG)
        backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m"))
        app = create_app(load_config(config), factory({"b": backend}))
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True})
        with serve_in_thread(app) as base:
            host, port = base.removeprefix("http://").split(":")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
            sock.connect((host, int(port)))
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            # Read nothing until the gateway's writes paused and the task wrote a chunk itself
            wait_until(lambda: len(by_task) >= 2, timeout=30, message="the writes never paused")
            received = b""
            while data := sock.recv(1 << 20):
                received += data
            sock.close()
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        engine.join(10)
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    stream = _unchunked(chunked)
    assert stream.endswith(b"data: [DONE]\n\n")
    got = [
        orjson.loads(raw[6:])["choices"][0]["delta"].get("content")
        for raw in stream.split(b"\n\n")
        if raw.startswith(b"data: {") and orjson.loads(raw[6:])["choices"]
    ]
    assert [t for t in got if t] == texts
    assert len(by_task) < len(texts) / 2, len(by_task)  # and most were pushed


def _unchunked(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out.append(rest[:n])
        rest = rest[n + 2 :]
    return b"".join(out)


def test_an_error_event_is_raised_at_once_by_an_engine_that_then_hangs() -> None:
    """The events that came before an error event in the same read are pushed; the error itself must
    wake the reader then, not wait for bytes an engine that broke may never send (the read timeout
    would then hide it)."""

    async def scenario() -> BaseException | None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in [_text(t) for t in TEXTS[:2]] + [_text(TEXTS[2]) + ERROR]:  # a text and the error together
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0.005)  # engine behaviour: a decoding pace
            await asyncio.sleep(30)  # engine behaviour: then it hangs, the body never ended

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m", read_timeout_s=5))
        request = GenerationRequest(request_id="r", model="m", messages=[{"role": "user", "content": "Hi"}])
        stream = backend.generate(request)
        assert isinstance(stream, AnswerStream)
        stream.push_to(lambda chunk: True)
        try:
            async for _ in stream:
                pass
        except BackendError as exc:
            return exc
        finally:
            await stream.aclose()
            await backend.aclose()
            server.close()
        return None

    error = asyncio.run(scenario())
    assert isinstance(error, BackendError) and error.kind is not ErrorKind.TIMEOUT, error

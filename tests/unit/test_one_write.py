"""One write per response (gateway/http/coalesce.py): the gateway's HTTP protocol, driven with a
transport that records its writes, sends a whole answer's head and body in one ``write()`` (one system
call), a stream's head with its first event, and never holds an interim ``100 Continue``."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http.coalesce import HeadWithBody
from gateway.http.protocol import GatewayHttpProtocol


class Recorded(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    stream = scope["path"] == "/stream"
    headers = [(b"content-type", b"text/event-stream")] if stream else [(b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if stream:
        for event in (b"data: 1\n\n", b"data: 2\n\n"):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        await send({"type": "http.response.body", "body": b'{"ok":true}'})


def _served(path: str, end: bytes) -> list[bytes]:
    """The writes of one request to ``path``, once one ends with ``end`` (the response's last bytes)."""

    async def go() -> list[bytes]:
        config = Config(app=_app, http="httptools", log_config=None, lifespan="off")
        config.load()
        protocol = GatewayHttpProtocol(config, ServerState(), {}, asyncio.get_running_loop())
        transport = Recorded()
        protocol.connection_made(transport)
        body = b"{}"
        head = f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        protocol.data_received(head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body)
        deadline = asyncio.get_running_loop().time() + 10
        while not (transport.writes and transport.writes[-1].endswith(end)):
            assert asyncio.get_running_loop().time() < deadline, transport.writes
            await asyncio.sleep(0)
        return transport.writes

    return asyncio.run(go())


def test_a_whole_answer_is_one_write() -> None:
    writes = _served("/whole", b'{"ok":true}')
    assert len(writes) == 1, writes
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b'\r\n\r\n{"ok":true}')


def test_a_streams_head_goes_with_its_first_event() -> None:
    writes = _served("/stream", b"0\r\n\r\n")
    assert len(writes) == 3, writes
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")


def test_an_interim_response_is_never_held_and_a_close_sends_what_is_held() -> None:
    transport = Recorded()
    out = HeadWithBody(transport)
    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert len(transport.writes) == 1, "the head waits for the body"
    out.close()
    assert transport.writes[1:] == [b"HTTP/1.1 200 OK\r\n\r\n"] and transport.closed

"""The engine HTTP client against small raw asyncio servers: framing, keep-alive, stale connections
(never a second delivery of a request that may have run), idle limits, per-phase deadlines, early
close, pool limit, bad responses, redirects, compressed bodies, trailers, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import select
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.http_base import HttpBackend, HttpSettings
from backends.httpclient import (
    CLOSE_HEADER,
    ConnectError,
    Headers,
    HttpClient,
    NoResponseError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
    ResponseTimeout,
    tls_context,
)
from backends.httpclient import connection as http_connection
from backends.httpclient import deadline as http_deadline
from gateway.config import ConfigError, load_config
from gateway.fleet.engines import build_backend
from tests.conftest import free_port
from tests.polling import eventually

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Request:
    def __init__(self, line: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.target, _ = line.split(" ", 2)
        self.headers = headers
        self.body = body


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One request from the client, None when it closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    line, *fields = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.strip().lower(): value.strip() for name, value in (f.split(":", 1) for f in fields)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(line, headers, body)


def ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def encoded(body: bytes, encoding: str) -> bytes:
    return ok(body, f"content-encoding: {encoding}", "content-type: application/json")


def chunked(*pieces: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    for piece in pieces:
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\n\r\n"


class Server:
    """A TCP server whose connections run ``handle(reader, writer, connection_number)``; counts
    connections accepted, open at once, and ended by the client (EOF)."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.accepted = 0
        self.open = 0
        self.peak = 0
        self.requests: list[Request] = []
        self.eof = asyncio.Event()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()  # the listening socket; handlers still running end with the loop

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            await self.handle(reader, writer, self.accepted)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def wait_eof(self, reader: asyncio.StreamReader) -> None:
        """The client closed its end: what an engine sees when a request is abandoned."""
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:  # a reset: the client closed with our bytes unread
            pass
        self.eof.set()


def keep_alive(respond: Callable[[Request], bytes]) -> Callable[[Server], Handler]:
    """A handler answering every request on a connection with ``respond(request)``."""

    def make(server: Server) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            while (request := await read_request(reader)) is not None:
                server.requests.append(request)
                writer.write(respond(request))
                await writer.drain()

        return handle

    return make


@contextlib.asynccontextmanager
async def serving(make: Callable[[Server], Handler]) -> AsyncIterator[Server]:
    """A server whose handler needs the server itself."""
    server = Server(lambda r, w, n: asyncio.sleep(0))  # a placeholder handler, replaced on the next line
    server.handle = make(server)
    async with server:
        yield server


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(body(), 20))


def test_content_length_body_and_request_headers() -> None:
    async def body() -> None:
        async with serving(
            keep_alive(lambda r: ok(b'{"ok": true}', "Retry-After: 3", "X-Twice: a", "x-twice: b"))
        ) as server:
            client = HttpClient(server.url + "/prefix/", api_key="sekret")
            response = await client.request("POST", "/v1/chat", b'{"a": 1}')
            assert response.status == 200
            assert await response.read() == b'{"ok": true}'
            assert response.headers["retry-after"] == "3" and response.headers.get("RETRY-AFTER") == "3"
            assert response.headers["x-twice"] == "a, b" and "X-Twice" in response.headers
            response.release()
            request = server.requests[0]
            assert (request.method, request.target, request.body) == ("POST", "/prefix/v1/chat", b'{"a": 1}')
            assert request.headers["content-type"] == "application/json"
            assert request.headers["content-length"] == "8"
            assert request.headers["authorization"] == "Bearer sekret"
            assert request.headers["accept-encoding"] == "identity"
            assert request.headers["host"] == server.url.removeprefix("http://")
            await client.aclose()

    run(body)


def test_get_has_no_body_headers() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"up"))) as server:
            client = HttpClient(server.url)
            response = await client.request("GET", "/health")
            assert (response.status, await response.read()) == (200, b"up")
            response.release()
            request = server.requests[0]
            assert (request.method, request.target) == ("GET", "/health")
            assert "content-length" not in request.headers and "authorization" not in request.headers
            await client.aclose()

    run(body)


def test_chunked_body_split_at_awkward_boundaries() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(20)] + [b"x" * 5000, b"data: [DONE]\n\n"]
    wire = chunked(*events)

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        # 1, 2, 3... bytes at a time: splits inside size lines, CRLFs and data alike
        pos, step = 0, 1
        while pos < len(wire):
            writer.write(wire[pos : pos + step])
            await writer.drain()
            await asyncio.sleep(0)  # engine behaviour: yield, so each write can reach the socket by itself
            pos += step
            step = step % 7 + 1 if pos < 400 else 997
        await read_request(reader)

    async def body() -> None:
        async with Server(dribble) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/stream", b"{}")
            pieces = []
            while piece := await response.read_chunk():
                pieces.append(piece)
            assert b"".join(pieces) == b"".join(events)
            assert len(pieces) > 1, "the body arrives as it comes"
            assert response.complete
            response.release()
            assert client.stats()["idle"] == 1, "a chunked body read to its end keeps the connection"
            await client.aclose()

    run(body)


def test_body_ending_at_connection_close() -> None:
    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.05)  # engine behaviour: the body comes in two pieces, not one
        writer.write(b"second")
        await writer.drain()

    async def body() -> None:
        async with Server(close_delimited) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert await response.read() == b"first second"
                response.release()
            assert server.accepted == 2, "a close-delimited body leaves nothing to reuse"
            await client.aclose()

    run(body)


def test_truncated_bodies_are_protocol_errors() -> None:
    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        wire = ok(b"0123456789") if n == 1 else chunked(b"abc", b"def")
        writer.write(wire[:-5])
        await writer.drain()

    async def body() -> None:
        async with Server(truncated) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                with pytest.raises(ProtocolError):
                    await response.read()
                response.release()
            assert client.stats() == {"open": 0, "slots": 0, "idle": 0, "waiting": 0}
            await client.aclose()

    run(body)


def test_keep_alive_reuses_one_connection() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(r.body))) as server:
            client = HttpClient(server.url)
            for i in range(5):
                response = await client.request("POST", "/echo", b"%d" % i)
                assert await response.read() == b"%d" % i
                response.release()
            assert server.accepted == 1
            await client.aclose()

    run(body)


def test_connection_close_from_the_server_is_honoured() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"bye", "Connection: close"))) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert await response.read() == b"bye"
                response.release()
            assert server.accepted == 2
            await client.aclose()

    run(body)


def test_idle_connection_closed_by_the_server_is_not_reused() -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(b"one"))
        await writer.drain()  # then close while the client holds the connection idle

    async def body() -> None:
        async with Server(one_then_close) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert await response.read() == b"one"
                response.release()
                await eventually(lambda: client.stats()["idle"] == 0, 5, message="the server's close is seen")
            assert server.accepted == 2
            await client.aclose()

    run(body)


def test_request_the_server_may_have_read_is_never_sent_again() -> None:
    """A reused connection that closes after the request was written, before any response byte: the
    engine may have read and run the request, so it is an error and not a second delivery."""

    async def close_on_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(b"first"))
        await writer.drain()
        # A keep-alive timeout (or a crash) just as the next request arrives: read it, answer nothing.
        second = await read_request(reader)
        assert second is not None
        requests.append(second)

    requests: list[Request] = []

    async def body() -> None:
        async with Server(close_on_second) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"1")
            assert await response.read() == b"first"
            response.release()
            with pytest.raises(NoResponseError) as info:
                await client.request("POST", "/", b"2")
            assert info.value.before_response and "may have been run" in str(info.value)
            assert [r.body for r in requests] == [b"2"]
            assert server.accepted == 1, "not sent again on a new connection"
            assert client.retries == 0
            assert client.stats()["slots"] == 0
            await client.aclose()

    run(body)


async def exchange_then_unseen_close(client: HttpClient, expect: bytes) -> None:
    """One exchange, then the loop blocked until the server's close of the pooled connection (an end
    of file or a reset) is in its socket: the client cannot have seen it yet."""
    response = await client.request("POST", "/", b"1")
    assert await response.read() == expect
    response.release()
    conn = next(iter(client.connections))
    poller = select.poll()
    poller.register(conn.fd, select.POLLIN)
    assert poller.poll(5000), "the server's close arrives"
    assert client.stats()["idle"] == 1


def test_write_failing_on_a_stale_connection_is_retried_once_on_a_new_one(caplog: pytest.LogCaptureFixture) -> None:
    """The server reset an idle connection and the event loop has not seen it yet: writing fails at
    once, so not one byte reached the server and the request goes once more on a new connection."""

    async def reset_after_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        request = await read_request(reader)
        if n == 1:
            writer.write(ok(b"first"))
            await writer.drain()
            # Close with a reset (linger 0) rather than an orderly end of file.
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        assert request is not None
        requests.append(request)
        writer.write(ok(b"second"))
        await writer.drain()

    requests: list[Request] = []

    async def body() -> None:
        async with Server(reset_after_first) as server:
            client = HttpClient(server.url)
            await exchange_then_unseen_close(client, b"first")
            with caplog.at_level(logging.WARNING, logger="enginegate.http"):
                response = await client.request("POST", "/", b"2")
            assert await response.read() == b"second"
            response.release()
            assert [r.body for r in requests] == [b"2"] and server.accepted == 2
            assert client.retries == 1
            assert any("sent again on a new connection" in r.getMessage() for r in caplog.records)
            await client.aclose()

    run(body)


def test_held_requests_on_stale_connections_are_retried_on_new_ones() -> None:
    """Two requests at once (so the second is held for the end of the loop's turn, ``outbox``) on two
    pooled connections the server has reset unseen: each write fails when it is made, nothing reached
    the server, and each request goes once more on a new connection, answered once. The server is a
    thread, so that the resets happen while the client's loop is blocked and cannot see them."""
    reset = threading.Event()
    bodies: list[bytes] = []

    def serve(listener: socket.socket) -> None:
        warm = []
        for n in range(4):
            sock, _ = listener.accept()
            data = b""
            while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < 1:
                data += sock.recv(65536)
            body = data.partition(b"\r\n\r\n")[2]
            if n < 2:
                sock.sendall(ok(b"warm"))
                warm.append(sock)
                if n == 1:
                    reset.wait(10)
                    for old in warm:  # a reset (linger 0), not an orderly end of file
                        old.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        old.close()
            else:
                bodies.append(body)
                sock.sendall(ok(b"again " + body, "connection: close"))
                sock.close()

    async def one(client: HttpClient, body: bytes) -> bytes:
        response = await client.request("POST", "/", body)
        data = await response.read()
        response.release()
        return data

    async def body() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        thread = threading.Thread(target=serve, args=(listener,), daemon=True)
        thread.start()
        client = HttpClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
        assert list(await asyncio.gather(one(client, b"1"), one(client, b"2"))) == [b"warm", b"warm"]
        assert client.stats()["idle"] == 2
        reset.set()
        poller = select.poll()  # the loop blocked until both resets are in the sockets
        for conn in client.connections:
            poller.register(conn.fd, select.POLLIN)
        deadline = time.monotonic() + 5
        while len(poller.poll(100)) < 2 and time.monotonic() < deadline:
            pass
        assert list(await asyncio.gather(one(client, b"a"), one(client, b"b"))) == [b"again a", b"again b"]
        assert sorted(bodies) == [b"a", b"b"] and client.retries == 2
        await client.aclose()
        thread.join(5)
        listener.close()

    run(body)


def test_stale_connection_with_an_unseen_end_of_file_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled connection idle long enough for a server timer to have closed it is looked at before
    reuse: an end of file the loop has not processed yet means a new connection, not a lost request."""
    monkeypatch.setattr(http_connection, "_PEEK_AFTER_S", 0.0)

    async def close_after_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        request = await read_request(reader)
        assert request is not None
        writer.write(ok(b"n%d" % n))
        await writer.drain()
        if n == 1:
            writer.close()
            return
        await read_request(reader)

    async def body() -> None:
        async with Server(close_after_first) as server:
            client = HttpClient(server.url)
            await exchange_then_unseen_close(client, b"n1")
            response = await client.request("POST", "/", b"2")  # before the loop reads that end of file
            assert await response.read() == b"n2"
            response.release()
            assert server.accepted == 2 and client.retries == 0 and client.discarded == 1
            await client.aclose()

    run(body)


def test_idle_connections_are_closed_after_the_idle_limit() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"x"))) as server:
            client = HttpClient(server.url, idle_timeout_s=0.2)
            for _ in range(3):  # within the limit: one connection
                response = await client.request("GET", "/")
                await response.read()
                response.release()
            assert server.accepted == 1
            await eventually(lambda: client.stats() == {"open": 0, "slots": 0, "idle": 0, "waiting": 0}, 5)
            assert client.discarded == 1
            response = await client.request("GET", "/")
            await response.read()
            response.release()
            assert server.accepted == 2, "a connection past the idle limit is not reused"
            await client.aclose()

    run(body)


@pytest.mark.parametrize(("field", "reused"), [("Keep-Alive: timeout=0", False), ("Keep-Alive: timeout=30", True)])
def test_keep_alive_timeout_from_the_server_is_honoured(field: str, reused: bool) -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"x", field))) as server:
            client = HttpClient(server.url, idle_timeout_s=30)
            for _ in range(2):
                response = await client.request("GET", "/")
                await response.read()
                response.release()
            assert server.accepted == (1 if reused else 2)
            await client.aclose()

    run(body)


def test_keep_alive_timeout_shortens_the_idle_limit() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"x", "Keep-Alive: timeout=1, max=100"))) as server:
            client = HttpClient(server.url, idle_timeout_s=30)
            response = await client.request("GET", "/")
            await response.read()
            response.release()
            conn = next(iter(client.connections))
            assert conn.idle_limit == 0.5, "half of a short server timeout, as a margin"
            await eventually(lambda: client.stats()["open"] == 0, 5, message="closed before the server's timeout")
            await client.aclose()

    run(body)


def test_a_new_connection_closing_before_the_response_is_not_retried() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async def body() -> None:
        async with Server(hang_up) as server:
            client = HttpClient(server.url)
            with pytest.raises(RemoteClosed) as info:
                await client.request("POST", "/", b"{}")
            assert info.value.before_response
            assert server.accepted == 1
            await client.aclose()

    run(body)


def test_connect_refused_is_connect_error() -> None:
    async def body() -> None:
        client = HttpClient(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
        with pytest.raises(ConnectError):
            await client.request("POST", "/", b"{}")
        assert client.stats()["slots"] == 0
        await client.aclose()

    run(body)


def test_deadlines_per_phase() -> None:
    """The response head has its own deadline from the request (a head dribbled a byte at a time
    cannot stretch it); the body has one for each silence."""

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 2:  # the head, a piece of body, then silence
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
        if n == 3:
            for byte in b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"p" * 500:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.01)  # engine behaviour: a head dribbled a byte at a time
        await asyncio.sleep(5)  # engine behaviour: then it hangs, silent, past every client deadline

    async def body() -> None:
        async with Server(slow) as server:
            client = HttpClient(server.url, response_timeout_s=0.2, read_timeout_s=30)
            started = time.monotonic()
            with pytest.raises(TimeoutError) as info:
                await client.request("POST", "/", b"{}")
            assert isinstance(info.value, ResponseTimeout) and time.monotonic() - started < 5
            client.response_timeout_s, client.read_timeout_s = 30, 0.2
            response = await client.request("POST", "/", b"{}")
            assert await response.read_chunk() == b"abc"
            with pytest.raises(ReadTimeout):
                await response.read_chunk()
            response.release()
            client.response_timeout_s, client.read_timeout_s = 0.3, 30
            started = time.monotonic()
            with pytest.raises(ResponseTimeout):
                await client.request("POST", "/", b"{}")
            assert time.monotonic() - started < 3
            assert client.stats()["slots"] == 0
            await client.aclose()

    run(body)


def test_a_stream_longer_than_the_read_timeout_lives_while_data_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read deadline is per silence, not per body: a stream that lasts several read timeouts, a
    piece every tick, is read whole; the silence after it times out. The deadline's timer is armed a
    few times for the whole stream, not once per read (a wait per event would otherwise pay for one)."""
    armed: list[float] = []
    arm = http_deadline.Deadline.arm

    def counted(self: http_deadline.Deadline, at: float) -> None:
        armed.append(at)
        arm(self, at)

    monkeypatch.setattr(http_deadline.Deadline, "arm", counted)

    async def ticking(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(40):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)  # engine behaviour: a token pace, 40 of them past the read timeout
        await asyncio.sleep(5)  # engine behaviour: then silence, past the client's read timeout

    async def body() -> None:
        async with Server(ticking) as server:
            client = HttpClient(server.url, response_timeout_s=30, read_timeout_s=0.3)
            response = await client.request("POST", "/", b"{}")
            got, reads = b"", 0
            started = time.monotonic()
            with pytest.raises(ReadTimeout):
                while len(got) < 41:
                    got += await response.read_chunk()
                    reads += 1
            assert got == b"x" * 40 and reads > 20
            assert time.monotonic() - started < 4.5  # the silence ended it, not the engine's close
            assert len(armed) < reads / 2, (len(armed), reads)
            response.close()
            await client.aclose()

    run(body)


def _streamer(server: Server) -> Handler:
    async def stream_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        watch = asyncio.ensure_future(server.wait_eof(reader))
        try:
            while not watch.done():
                writer.write(b"6\r\ntoken \r\n")
                await writer.drain()
                await asyncio.sleep(0.01)  # engine behaviour: the pace of an endless token stream
        except ConnectionError:  # the client's close seen as a reset rather than as EOF
            server.eof.set()
        finally:
            watch.cancel()

    return stream_forever


def test_leaving_a_response_early_closes_the_connection() -> None:
    async def body() -> None:
        async with serving(_streamer) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"{}")
            assert (await response.read_chunk()).startswith(b"token")
            response.release()  # not read to the end: closed, not pooled
            await asyncio.wait_for(server.eof.wait(), 2)
            assert client.stats() == {"open": 0, "slots": 0, "idle": 0, "waiting": 0}
            await client.aclose()

    run(body)


def test_cancelled_read_closes_the_connection() -> None:
    async def body() -> None:
        async with serving(_streamer) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"{}")

            pieces: list[bytes] = []

            async def read_all() -> None:
                while piece := await response.read_chunk():
                    pieces.append(piece)

            task = asyncio.ensure_future(read_all())
            await eventually(lambda: len(pieces) >= 3, 5)  # reading, in the middle of the stream
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(server.eof.wait(), 2)
            assert client.stats()["slots"] == 0
            await client.aclose()

    run(body)


def test_pool_limit_is_respected_under_concurrency() -> None:
    async def slow_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await read_request(reader) is not None:
            await asyncio.sleep(0.02)  # engine behaviour: a slow answer, so requests pile up on the pool
            writer.write(ok(b"done"))
            await writer.drain()

    async def body() -> None:
        async with Server(slow_ok) as server:
            client = HttpClient(server.url, max_connections=3)

            async def one() -> bytes:
                response = await client.request("POST", "/", b"{}")
                try:
                    return await response.read()
                finally:
                    response.release()

            results = await asyncio.gather(*(one() for _ in range(20)))
            assert results == [b"done"] * 20
            assert server.accepted == 3 and server.peak == 3
            assert client.stats() == {"open": 3, "slots": 3, "idle": 3, "waiting": 0}

            # A request cancelled while waiting for a connection gives nothing away.
            tasks = [asyncio.ensure_future(one()) for _ in range(6)]
            await eventually(lambda: client.stats()["waiting"] == 3, 5)
            tasks[4].cancel()  # one of those waiting
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert done.count(b"done") == 5
            assert client.stats()["slots"] == 3 and client.stats()["waiting"] == 0
            await client.aclose()

    run(body)


def test_flow_control_pauses_and_resumes_reading() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB

    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(big))) as server:
            client = HttpClient(server.url, read_limit=64 * 1024)
            response = await client.request("GET", "/big")
            conn = next(iter(client.connections))
            # The reader dawdles: reading from the socket pauses instead of buffering the whole body.
            await eventually(lambda: conn.paused, 5)
            assert conn.buffered < 64 * 1024 + 300_000
            assert await response.read() == big
            response.release()
            assert client.stats()["idle"] == 1
            await client.aclose()

    run(body)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nx-huge: " + b"a" * 70_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-many: a\r\n" * 7000 + b"\r\n",
        b"this is not http at all\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\nx-big: " + b"b" * 70_000 + b"\r\n\r\n",
        encoded(b"anything", "br"),
        encoded(b"this is not gzip", "gzip"),
        encoded(gzip.compress(b"x" * 1000)[:-8], "gzip"),
    ],
    ids=[
        "oversized-head",
        "many-fields",
        "garbage",
        "two-lengths",
        "bad-chunk-size",
        "oversized-trailers",
        "unsupported-encoding",
        "not-gzip",
        "gzip-cut-short",
    ],
)
def test_bad_responses_are_protocol_errors(wire: bytes) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(wire)
        await writer.drain()
        await asyncio.sleep(1)  # engine behaviour: the connection stays open, so the parse fails, not the close

    async def body() -> None:
        async with Server(bad) as server:
            # A head (or trailers) beyond 64 KiB fails although the body buffer (8 MiB) would hold it.
            client = HttpClient(server.url)
            with pytest.raises(ProtocolError):
                response = await client.request("GET", "/")
                await response.read()
            assert client.stats()["slots"] == 0
            await client.aclose()

    run(body)


def test_informational_responses_are_skipped() -> None:
    async def body() -> None:
        async with serving(
            keep_alive(lambda r: b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + ok(b"real"))
        ) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert (response.status, await response.read()) == (200, b"real")
                assert "link" not in response.headers
                response.release()
            assert server.accepted == 1
            await client.aclose()

    run(body)


def test_extra_bytes_after_a_response_stop_reuse() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"one") + ok(b"two"))) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert await response.read() == b"one"
                response.release()
                await eventually(lambda: client.stats()["open"] == 0, 5, message="closed on unasked-for bytes")
            assert server.accepted == 2
            await client.aclose()

    run(body)


def test_error_status_is_a_response() -> None:
    async def body() -> None:
        async with serving(
            keep_alive(lambda r: b"HTTP/1.1 503 Busy\r\ncontent-length: 4\r\nretry-after: 2\r\n\r\nbusy")
        ) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"{}")
            assert (response.status, await response.read(), response.headers["Retry-After"]) == (503, b"busy", "2")
            response.release()
            await client.aclose()

    run(body)


def test_aclose_closes_everything_and_refuses_more() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"x"))) as server:
            client = HttpClient(server.url)
            response = await client.request("GET", "/")
            await response.read()
            response.release()
            await client.aclose()
            assert client.closed and client.stats()["open"] == 0
            with pytest.raises(ConnectError):
                await client.request("GET", "/")

    run(body)


def test_headers_mapping() -> None:
    headers = Headers([(b"Content-Type", b"text/plain"), (b"SET-thing", b"a"), (b"set-thing", b"b")])
    assert dict(headers) == {"content-type": "text/plain", "set-thing": "a, b"}
    assert headers["CONTENT-TYPE"] == "text/plain" and headers.get("missing") is None and len(headers) == 2


# Compressed bodies: identity is asked for; gzip and deflate sent anyway are decoded as read, bounded.


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send it
    ],
    ids=["gzip", "deflate", "raw-deflate"],
)
def test_compressed_bodies_are_decoded(encoding: str, compress: Callable[[bytes], bytes]) -> None:
    plain = b'{"text": "%s"}' % (b"word " * 5000)

    async def body() -> None:
        async with serving(keep_alive(lambda r: encoded(compress(plain), encoding))) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("POST", "/", b"{}")
                assert response.content_type == "application/json"
                assert await response.read() == plain
                response.release()
            assert server.accepted == 1, "a decoded body read to its end keeps the connection"
            await client.aclose()

    run(body)


def test_compressed_stream_is_decoded_as_it_arrives() -> None:
    got_first = asyncio.Event()

    async def gzip_sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n")
        packer = zlib.compressobj(wbits=31)
        for i, event in enumerate([b"data: one\n\n", b"data: two\n\n"]):
            piece = packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            if i == 0:
                await got_first.wait()  # the rest only once the client decoded the first event
        tail = packer.flush()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        await writer.drain()
        await read_request(reader)

    async def body() -> None:
        async with Server(gzip_sse) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"{}")
            assert await response.read_chunk() == b"data: one\n\n"
            got_first.set()
            assert await response.read() == b"data: two\n\n"
            response.release()
            await client.aclose()

    run(body)


def test_a_compressed_body_cannot_fill_memory() -> None:
    """16 MiB of zeros in a few KiB of gzip: decoded a bounded piece per read, never all at once."""
    plain_size, limit = 16 * 1024 * 1024, 256 * 1024
    bomb = gzip.compress(bytes(plain_size))

    async def body() -> None:
        async with serving(keep_alive(lambda r: encoded(bomb, "gzip"))) as server:
            client = HttpClient(server.url, read_limit=limit)
            response = await client.request("GET", "/")
            sizes = []
            while piece := await response.read_chunk():
                sizes.append(len(piece))
            response.release()
            assert sum(sizes) == plain_size and max(sizes) <= limit
            await client.aclose()

    run(body)


# Trailers


def test_chunked_trailers_are_kept_apart_from_the_headers() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n"
        b"5\r\nhello\r\n0\r\nx-checksum: abc\r\ncontent-type: text/html\r\n\r\n"
    )

    async def body() -> None:
        async with serving(keep_alive(lambda r: wire)) as server:
            client = HttpClient(server.url)
            for _ in range(2):
                response = await client.request("GET", "/")
                assert await response.read() == b"hello"
                assert "x-checksum" not in response.headers and "content-type" not in response.headers
                assert response.content_type == ""
                assert dict(response.trailers) == {"x-checksum": "abc", "content-type": "text/html"}
                response.release()
            assert server.accepted == 1
            await client.aclose()

    run(body)


# TLS, against a real local TLS server with certificates made for the test


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_extensions = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA", *ca_extensions
    )
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (d / f"{name}.ext").write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")  # fmt: skip
    return d


@contextlib.asynccontextmanager
async def tls_server(pki: Path, require_client_cert: bool = False) -> AsyncIterator[Server]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.pem")
    server = Server(lambda r, w, n: asyncio.sleep(0))  # a placeholder handler, replaced on the next line
    server.handle = keep_alive(lambda r: ok(b"secure"))(server)
    server.server = await asyncio.start_server(server._connection, "127.0.0.1", 0, ssl=context)
    server.url = f"https://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        server.server.close()


async def fetch(client: HttpClient) -> bytes:
    response = await client.request("GET", "/")
    try:
        return await response.read()
    finally:
        response.release()


def test_tls_with_a_private_ca(pki: Path) -> None:
    async def body() -> None:
        async with tls_server(pki) as server:
            client = HttpClient(server.url, ssl_context=tls_context(ca_file=str(pki / "ca.pem")))
            assert [await fetch(client), await fetch(client)] == [b"secure", b"secure"]
            assert server.accepted == 1
            await client.aclose()

            untrusting = HttpClient(server.url)  # the system's CAs do not know the test CA
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await fetch(untrusting)
            await untrusting.aclose()

            unverified = HttpClient(server.url, ssl_context=tls_context(verify=False))
            assert await fetch(unverified) == b"secure"
            await unverified.aclose()

    run(body)


def test_tls_client_certificate(pki: Path) -> None:
    async def body() -> None:
        async with tls_server(pki, require_client_cert=True) as server:
            ca = str(pki / "ca.pem")
            anonymous = HttpClient(server.url, ssl_context=tls_context(ca_file=ca))
            with pytest.raises((ConnectError, ProtocolError)):  # TLS 1.3: refused after the handshake
                await fetch(anonymous)
            await anonymous.aclose()

            context = tls_context(ca_file=ca, cert_file=str(pki / "client.pem"), key_file=str(pki / "client.key"))
            client = HttpClient(server.url, ssl_context=context)
            assert await fetch(client) == b"secure"
            await client.aclose()

    run(body)


# The adapters' side (http_base): what a response must be before its body is read as the engine's


class Plain(HttpBackend):
    """The smallest adapter: POST, and the body as one chunk."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        async with self.open_stream(request, "/generate", {"prompt": request.prompt}) as response:
            yield Chunk(text=(await self.read_body(response, request.clock)).decode(), finish_reason="stop")


async def generate_once(url: str, request_id: str = "req-1") -> list[Chunk]:
    backend = Plain("plain", "m", HttpSettings(url=url, served_model="m"))
    try:
        return [c async for c in backend.generate(GenerationRequest(request_id, "m", prompt="hi"))]
    finally:
        await backend.aclose()


def generation_error(wire: bytes) -> tuple[BackendError, list[Request]]:
    async def body() -> tuple[BackendError, list[Request]]:
        async with serving(keep_alive(lambda r: wire)) as server:
            with pytest.raises(BackendError) as info:
                await generate_once(server.url)
            return info.value, server.requests

    return run(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_a_protocol_error_naming_status_and_location(status: int) -> None:
    wire = b"HTTP/1.1 %d Moved\r\nlocation: https://sso.example/login\r\ncontent-length: 0\r\n\r\n" % status
    error, requests = generation_error(wire)
    assert error.kind is ErrorKind.PROTOCOL
    assert str(status) in error.message and "https://sso.example/login" in error.message
    assert len(requests) == 1, "not followed"


def test_an_html_page_on_success_is_a_protocol_error() -> None:
    error, _ = generation_error(
        ok(b"<html><body>Please log in</body></html>", "content-type: text/html; charset=utf-8")
    )
    assert error.kind is ErrorKind.PROTOCOL and "text/html" in error.message


def test_the_request_id_is_forwarded_to_the_engine() -> None:
    async def body() -> None:
        async with serving(keep_alive(lambda r: ok(b"fine", "content-type: application/json"))) as server:
            assert (await generate_once(server.url, request_id="abc-123"))[0].text == "fine"
            await generate_once(server.url, request_id="bad\r\ninjected: 1")
            first, second = server.requests
            assert first.headers["x-request-id"] == "abc-123"
            assert "x-request-id" not in second.headers and "injected" not in second.headers

    run(body)


def test_a_request_the_engine_may_have_run_is_a_retryable_error_not_a_resend() -> None:
    """The adapter sees a request whose connection closed before any response as an engine fault that
    another backend may retry, and the transport never sent it twice."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async def body() -> None:
        async with Server(hang_up) as server:
            backend = Plain("plain", "m", HttpSettings(url=server.url, served_model="m"))
            with pytest.raises(BackendError) as info:
                [c async for c in backend.generate(GenerationRequest("r", "m", prompt="hi"))]
            assert info.value.kind is ErrorKind.PROTOCOL and info.value.retryable and info.value.engine_fault
            assert "no response" in info.value.message and server.accepted == 1
            assert backend.transport_retries == 0
            await backend.aclose()

    run(body)


def test_tls_settings_from_the_config_file(pki: Path, tmp_path: Path) -> None:
    """``tls:`` on an https backend: paths relative to the config file, the CA trusted, the client
    certificate presented; mistakes are config errors."""
    shutil.copy(pki / "ca.pem", tmp_path / "ca.pem")

    def config(url: str, tls: str) -> Path:
        path = tmp_path / "gateway.yaml"
        path.write_text(
            "models: [{name: m, params_b: 1}]\n"
            f"backends: [{{name: b, engine: vllm, model: m, url: '{url}', idle_timeout_s: 2.5, tls: {tls}}}]\n"
        )
        return path

    client_cert = f"cert_file: '{pki / 'client.pem'}', key_file: '{pki / 'client.key'}'"

    async def body() -> None:
        async with tls_server(pki, require_client_cert=True) as server:
            loaded = load_config(config(server.url, f"{{ca_file: ca.pem, {client_cert}}}"))
            backend = build_backend(loaded.config.backends[0], loaded)
            assert isinstance(backend, HttpBackend) and backend.settings.idle_timeout_s == 2.5
            assert await backend.probe("/health") == (200, b"secure")
            await backend.aclose()

    run(body)

    def problems(url: str, tls: str) -> str:
        with pytest.raises(ConfigError) as info:
            loaded = load_config(config(url, tls))
            build_backend(loaded.config.backends[0], loaded)
        return "\n".join(info.value.problems)

    assert "key_file needs cert_file" in problems("https://e:1", "{key_file: k.pem}")
    assert "ca_file is unused with verify: false" in problems("https://e:1", "{ca_file: ca.pem, verify: false}")
    assert "tls needs an https:// url" in problems("http://e:1", "{verify: false}")
    assert "backend b: tls:" in problems("https://e:1", "{ca_file: missing.pem}")


def test_connection_close_asked_by_the_request_is_never_reused() -> None:
    """llama-server ends the connection after a streamed answer without saying so; its adapter asks
    ``Connection: close`` for streams, and the client must then never write another request there."""

    async def stream_then_close_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await read_request(reader)) is not None:
            requests.append(request)
            writer.write(ok(b"data: x\n\n"))
            await writer.drain()
            if request.headers.get("connection") == "close":
                await asyncio.sleep(0.05)  # the server's close comes after the client is done reading
                return

    requests: list[Request] = []

    async def body() -> None:
        async with Server(stream_then_close_late) as server:
            client = HttpClient(server.url)
            for _ in range(3):
                response = await client.request("POST", "/stream", b"{}", CLOSE_HEADER)
                assert await response.read() == b"data: x\n\n"
                response.release()
            assert server.accepted == 3, "each request on a connection of its own"
            assert len(requests) == 3 and client.retries == 0
            await client.aclose()

    run(body)

"""The engine HTTP client against small raw asyncio servers: framing, keep-alive, stale connections,
timeouts, early close, pool limit, bad responses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from backends.http_client import (
    ConnectError,
    Headers,
    HttpClient,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
)
from tests.conftest import free_port

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
    server = Server(lambda r, w, n: asyncio.sleep(0))
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
            await asyncio.sleep(0)
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
        await asyncio.sleep(0.05)
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
                await asyncio.sleep(0.1)
            assert server.accepted == 2
            await client.aclose()

    run(body)


def test_stale_connection_closing_as_reused_retries_once_on_a_new_one() -> None:
    async def close_on_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(b"first"))
        await writer.drain()
        # A keep-alive timeout that fires just as the next request arrives: read it, answer nothing.
        await read_request(reader)

    async def body() -> None:
        async with Server(close_on_second) as server:
            client = HttpClient(server.url)
            response = await client.request("POST", "/", b"1")
            assert await response.read() == b"first"
            response.release()
            response = await client.request("POST", "/", b"2")
            assert await response.read() == b"first"
            response.release()
            assert server.accepted == 2
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


def test_read_timeouts() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 2:  # the head, a piece of body, then silence
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    async def body() -> None:
        async with Server(slow) as server:
            client = HttpClient(server.url, read_timeout_s=0.2)
            with pytest.raises(TimeoutError) as info:
                await client.request("POST", "/", b"{}")
            assert isinstance(info.value, ReadTimeout)
            response = await client.request("POST", "/", b"{}")
            assert await response.read_chunk() == b"abc"
            with pytest.raises(ReadTimeout):
                await response.read_chunk()
            response.release()
            assert client.stats()["slots"] == 0
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
                await asyncio.sleep(0.01)
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

            async def read_all() -> None:
                while await response.read_chunk():
                    pass

            task = asyncio.ensure_future(read_all())
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(server.eof.wait(), 2)
            assert client.stats()["slots"] == 0
            await client.aclose()

    run(body)


def test_pool_limit_is_respected_under_concurrency() -> None:
    async def slow_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await read_request(reader) is not None:
            await asyncio.sleep(0.02)
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
            await asyncio.sleep(0.005)
            tasks[4].cancel()
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
            await asyncio.sleep(0.1)  # the reader dawdles: the socket must not be read past the limit
            conn = next(iter(client.connections))
            assert conn.paused and conn.buffered < 64 * 1024 + 300_000
            assert await response.read() == big
            response.release()
            assert client.stats()["idle"] == 1
            await client.aclose()

    run(body)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nx-huge: " + b"a" * 10_000 + b"\r\n\r\n",
        b"this is not http at all\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    ],
    ids=["oversized-head", "garbage", "two-lengths", "bad-chunk-size"],
)
def test_bad_responses_are_protocol_errors(wire: bytes) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(wire)
        await writer.drain()
        await asyncio.sleep(1)

    async def body() -> None:
        async with Server(bad) as server:
            client = HttpClient(server.url, read_limit=4096)
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
                await asyncio.sleep(0.05)
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

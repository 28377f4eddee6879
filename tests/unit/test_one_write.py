"""One write per response (gateway/http/coalesce.py): the gateway's HTTP protocol, driven with a
transport that records its writes, sends a whole answer's head and body in one ``write()`` (one system
call), a stream's head with its first event, and never holds an interim ``100 Continue``; a whole
response sent in one call on the request cycle (``send_whole``), and a stream's head and events
(``start_chunked``, ``send_chunk``), are byte for byte what uvicorn's ``send`` writes for them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, RequestResponseCycle
from uvicorn.server import ServerState

from gateway.http import exchange
from gateway.http.coalesce import _OWN, _USUAL, HeadWithBody, _head, cycle_of, send_chunk, send_whole, start_chunked
from gateway.http.exchange import Exchange
from gateway.http.protocol import GatewayHttpProtocol
from tests.compiled import compiled


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


async def _respond(ex: Exchange) -> None:
    await ex.respond(429, b'{"error":1}', [(b"retry-after", b"2"), (b"X-Limit", b"a b")])


def _exchange_app(direct: bool, heard: list[Any], answer: Callable[[Exchange], Awaitable[None]] = _respond) -> Any:
    """An app answering through an ``Exchange`` (``answer``; default a whole error response);
    ``direct``: with the cycle's own ``send`` (the one-call path), else through a wrapper, which leaves
    it to uvicorn's ``send``. A ``receive`` waiting while it answers (as the gateway's disconnect
    watcher does) hears the end of the exchange: into ``heard`` (an app's own failure is only logged
    by uvicorn)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()

        async def wrapped(message: Any) -> None:
            await send(message)

        waiting = asyncio.ensure_future(receive())
        await asyncio.sleep(0)
        await answer(Exchange(receive, send if direct else wrapped, "r1"))
        heard.append(await asyncio.wait_for(waiting, 5))

    return app


def _answered(app: Any, request_heads: list[str], heard: list[Any] | None = None) -> tuple[list[bytes], bool, int]:
    """What the protocol wrote for each request (sent one after the other on one connection), whether
    it closed the connection, and how many responses the server counted as complete; with ``heard``,
    once the app put something there for each request."""

    async def go() -> tuple[list[bytes], bool, int]:
        # No access log, as the gateway serves (with one, and pytest's log handlers make one, it is send's).
        config = Config(app=app, http="httptools", log_config=None, lifespan="off", access_log=False)
        config.load()
        state = ServerState()
        protocol = GatewayHttpProtocol(config, state, {}, asyncio.get_running_loop())
        transport = Recorded()
        protocol.connection_made(transport)
        for n, head in enumerate(request_heads, 1):
            protocol.data_received(head.encode() + b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            deadline = asyncio.get_running_loop().time() + 10
            while len(transport.writes) < n or state.total_requests < n or len(heard or [None] * n) < n:
                assert asyncio.get_running_loop().time() < deadline, (transport.writes, state.total_requests)
                await asyncio.sleep(0)
        return transport.writes, transport.closed, state.total_requests

    return asyncio.run(go())


CONNECTIONS = [
    ["POST /a HTTP/1.1\r\nhost: localhost\r\n", "POST /b HTTP/1.1\r\nhost: localhost\r\n"],  # kept alive
    ["POST /a HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n"],
    ["POST /a HTTP/1.0\r\nhost: localhost\r\n"],
]


def _same_as_send(app: Callable[[bool, list[Any]], Any], heads: list[str], patches: dict[str, Any]) -> list[bytes]:
    """The writes of ``app(direct=True, ...)`` (with ``patches`` on the exchange module), checked against
    ``app(direct=False, ...)``, whose responses go through uvicorn's ``send``: the same bytes, the
    connection left the same way (the next request answered, or closed), every exchange's end heard."""
    with pytest.MonkeyPatch.context() as patch:
        for name, stand_in in patches.items():
            patch.setattr(exchange, name, stand_in)
        fast_heard: list[Any] = []
        fast, fast_closed, fast_done = _answered(app(True, fast_heard), heads, fast_heard)
    slow_heard: list[Any] = []
    slow, slow_closed, slow_done = _answered(app(False, slow_heard), heads, slow_heard)
    assert fast_heard == slow_heard == [{"type": "http.disconnect"}] * len(heads)
    assert fast == slow, (fast, slow)
    assert fast_closed == slow_closed == (len(heads) == 1)
    assert fast_done == slow_done == len(heads)
    return fast


@pytest.mark.parametrize("heads", CONNECTIONS)
def test_a_whole_response_in_one_call_is_what_uvicorns_send_writes(heads: list[str]) -> None:
    """``send_whole`` writes the same bytes as the cycle's ``send`` of the same response, leaves the
    connection as it would (the next request answered, or the connection closed), in one write each."""
    calls: list[bool] = []

    def counted(*args: Any) -> bool:
        calls.append(send_whole(*args))
        return calls[-1]

    fast = _same_as_send(lambda direct, heard: _exchange_app(direct, heard), heads, {"send_whole": counted})
    # Compiled, the exchange calls send_whole directly (no module attribute to patch): the bytes still count.
    assert calls == [True] * len(heads) or (compiled(exchange) and not calls)
    assert len(fast) == len(heads)
    assert fast[0].startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and b"retry-after: 2\r\n" in fast[0]


def _on_cycle(check: Callable[[RequestResponseCycle], None]) -> Any:
    """An app that reads its request, runs ``check`` on the request's uvicorn cycle, then answers
    ``{}`` through ``Exchange``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        cycle = cycle_of(send)
        assert cycle is not None
        check(cycle)
        await Exchange(receive, send, "r1").respond(200, b"{}")

    return app


def test_the_usual_header_names_are_written_as_they_are_and_others_as_send_writes_them() -> None:
    """A usual name skips ``lower()`` and the look-up of ``_OWN``: it must be one ``send`` writes unchanged."""
    assert all(name == name.lower() and name not in _OWN for name in _USUAL)
    heads: list[list[bytes] | None] = []

    def check(cycle: RequestResponseCycle) -> None:
        for headers in ([(b"X-Request-ID", b"1"), (b"x-request-id", b"2")], [(b"Content-Length", b"2")]):
            heads.append(_head(cycle, 200, headers))

    _answered(_on_cycle(check), ["POST /a HTTP/1.1\r\nhost: localhost\r\n"])
    assert heads[0] is not None and b"".join(heads[0]).endswith(b"x-request-id: 1\r\nx-request-id: 2\r\n")
    assert heads[1] is None


def test_a_header_send_refuses_is_left_to_send() -> None:
    cycle_headers = [(b"x-bad", b"a\nb")]

    def check(cycle: RequestResponseCycle) -> None:
        assert not send_whole(cycle, 200, cycle_headers, b"{}") and not cycle.response_started

    writes, _, _ = _answered(_on_cycle(check), ["POST /a HTTP/1.1\r\nhost: localhost\r\n"])
    assert writes[0].endswith(b"\r\n\r\n{}")


def test_every_byte_send_refuses_in_a_header_is_refused_and_no_other() -> None:
    """The head is left to ``send`` for a header name or value holding a byte uvicorn's patterns refuse,
    and built for one holding any other byte: all 256, in a name and in a value, against the patterns."""
    refused: list[tuple[str, int, bool, bool]] = []

    def check(cycle: RequestResponseCycle) -> None:
        for b in range(256):
            byte = bytes((b,))
            for where, headers, pattern in (
                ("name", [(b"x-a" + byte + b"b", b"v")], HEADER_RE),
                ("value", [(b"x-a", b"v" + byte + b"w")], HEADER_VALUE_RE),
            ):
                refused.append((where, b, _head(cycle, 200, headers) is None, pattern.search(byte) is not None))

    _answered(_on_cycle(check), ["POST /a HTTP/1.1\r\nhost: localhost\r\n"])
    assert len(refused) == 512
    assert [r for r in refused if r[2] != r[3]] == []
    assert sum(r[2] for r in refused) > 60  # both patterns refuse some bytes: the check can fail


def _stream_app(direct: bool, heard: list[Any], ends: tuple[bytes, ...]) -> Any:
    """An app streaming through ``Exchange`` (head, two events, the end with ``ends[n - 1]`` for the
    connection's n-th request); ``direct`` and ``heard`` as in ``_exchange_app``."""
    served: list[None] = []

    async def stream(ex: Exchange) -> None:
        ex.header("x-route", "a")
        await ex.start_stream()
        await ex.stream(b"data: 1\n\n")
        await ex.stream(b"")
        await ex.stream(b"data: 2\n\n")
        served.append(None)
        await ex.end_stream(ends[len(served) - 1])

    return _exchange_app(direct, heard, stream)


@pytest.mark.parametrize("heads", CONNECTIONS)
def test_a_stream_on_the_cycle_is_what_uvicorns_send_writes(heads: list[str]) -> None:
    """``start_chunked`` and ``send_chunk`` write the same bytes as the cycle's ``send`` of the same
    messages (an empty event, an end with events and one without), and leave the connection as it
    would."""
    ends = (b"data: [DONE]\n\n", b"")
    calls: list[bool] = []

    def counted(real: Any) -> Any:
        def call(*args: Any) -> bool:
            calls.append(real(*args))
            return calls[-1]

        return call

    patches = {"start_chunked": counted(start_chunked), "send_chunk": counted(send_chunk)}
    fast = _same_as_send(lambda direct, heard: _stream_app(direct, heard, ends), heads, patches)
    assert calls == [True] * 5 * len(heads) or (compiled(exchange) and not calls)
    assert fast[0].startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked\r\n" in fast[0]
    assert fast[-1].endswith(b"0\r\n\r\n")


def test_a_paused_or_finished_stream_is_left_to_send() -> None:
    """A paused transport (``send`` waits for its drain), a response not started or already complete:
    nothing written, False."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        cycle = cycle_of(send)
        assert cycle is not None
        assert not send_chunk(cycle, b"data: 1\n\n", True), "not started"
        cycle.flow.write_paused = True
        assert not start_chunked(cycle, 200, []) and not cycle.response_started
        cycle.flow.write_paused = False
        assert start_chunked(cycle, 200, [])
        cycle.flow.write_paused = True
        assert not send_chunk(cycle, b"data: 1\n\n", True)
        cycle.flow.write_paused = False
        assert send_chunk(cycle, b"data: 1\n\n", False) and cycle.response_complete
        assert not send_chunk(cycle, b"data: 2\n\n", False)

    writes, _, _ = _answered(app, ["POST /a HTTP/1.1\r\nhost: localhost\r\n"])
    assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n"), writes

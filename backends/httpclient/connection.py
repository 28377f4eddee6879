"""One connection to the engine and the response being parsed on it (httptools, an ``asyncio.Protocol``).

The pool (``pool.HttpClient``) owns connections through the small ``Pool`` interface below; a
``Response`` reads the body a connection has received.
"""

from __future__ import annotations

import asyncio
import logging
import select
import zlib
from collections.abc import Callable
from typing import Protocol

import httptools

from backends.httpclient.deadline import Deadline
from backends.httpclient.errors import (
    HttpError,
    NoResponseError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
    RequestNotSentError,
    ResponseTimeout,
)
from backends.httpclient.outbox import Outbox
from values.calls import perf_counter

# Servers close idle connections on timers of a second or more: a connection idle for less needs no
# look at its socket (a system call) before it is reused.
_PEEK_AFTER_S = 1.0

log = logging.getLogger("enginegate.http")


class Pool(Protocol):
    """What a connection and its response need from the pool that owns them."""

    connections: set[Connection]
    idle_timeout_s: float
    max_head_bytes: int
    read_limit: int
    response_timeout_s: float
    read_timeout_s: float

    def in_flight(self) -> int:
        """Its connections taken by requests (one alone is written at once, not held)."""

    def lost(self, conn: Connection) -> None:
        """The connection closed (or broke): it leaves the pool and gives up its slot."""

    def release(self, conn: Connection) -> None:
        """Done with the connection's response: back to the pool if reusable, else closed."""


def _keep_alive_s(value: bytes) -> float | None:
    """``timeout=N`` from a ``Keep-Alive`` header field, if it has one that parses."""
    for part in value.split(b","):
        key, _, number = part.partition(b"=")
        if key.strip().lower() == b"timeout":
            try:
                return max(0.0, float(number.strip()))
            except ValueError:
                return None
    return None


def _decoder(encoding: bytes) -> zlib._Decompress | None:
    coding = encoding.strip().lower()
    if coding in (b"", b"identity"):
        return None
    if coding in (b"gzip", b"x-gzip"):
        return zlib.decompressobj(wbits=31)
    if coding == b"deflate":
        return zlib.decompressobj(wbits=15)  # zlib-wrapped, as specified; raw deflate is tried if not
    raise ProtocolError(
        f"the server sent a body with Content-Encoding {coding.decode('latin-1')!r} although asked for "
        "identity; only gzip and deflate are decoded"
    )


def _readable(fd: int) -> bool:
    """Anything to read on an idle socket (data, an end of file, a reset): it cannot serve again."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


CLOSE_HEADER = b"connection: close\r\n"
"""Sent by a caller that wants the connection to end with the response (the client then never reuses it)."""
_CLOSE = CLOSE_HEADER


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the state of the response being received on it."""

    def __init__(self, client: Pool, loop: asyncio.AbstractEventLoop, outbox: Outbox) -> None:
        self.client = client
        self.loop = loop
        """Its event loop, kept: ``asyncio.get_running_loop()`` costs a system call per call."""
        self.outbox = outbox
        """Where its requests wait for the end of the loop's turn (shared by the loop's connections)."""
        self.transport: asyncio.Transport | None = None
        self.fd = -1
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.busy = False
        """Owned by a request (or being handed to one), not idle in the pool."""
        self.holds_slot = False
        """Counted against the pool's limit; cleared when its slot is given up or passed on."""
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.listener: Callable[[], bool] | None = None
        """Called with each arrival of body bytes while a wait is pending: True when it took care of
        them (the waiter is not woken), False to wake it (``Response.listen``)."""
        self.deadline = Deadline(loop, self._expire)
        """The waits' deadline (``wait``), on one timer for every wait."""
        self.arrived = 0.0
        """``time.perf_counter()`` when bytes last came in (before parsing them)."""
        self.idle_since = 0.0
        """``loop.time()`` when it went back to the pool."""
        self._reset()

    def _reset(self) -> None:
        self.listener = None
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.trailers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.head = False
        self.done = False
        self.keep_alive = False
        self.closing = False
        """The request said ``Connection: close``: the connection ends with this response."""
        self.idle_limit = self.client.idle_timeout_s
        self.until_eof = False
        self.informational = False
        self.content_type = b""
        self.decoder: zlib._Decompress | None = None
        self.raw_deflate_possible = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.received = 0
        self.error: HttpError | None = None

    @property
    def reusable(self) -> bool:
        return (
            self.done
            and self.keep_alive
            and self.idle_limit > 0
            and self.error is None
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def usable(self, now: float) -> bool:
        """An idle connection can take a request: open, young enough, and (when idle long enough for a
        server's idle timer to have closed it) nothing to read on it that the loop has not seen yet."""
        transport = self.transport
        idle_s = now - self.idle_since
        return (
            not self.closed
            and transport is not None
            and not transport.is_closing()
            and idle_s < self.idle_limit
            and (idle_s < _PEEK_AFTER_S or self.fd < 0 or not _readable(self.fd))
        )

    def send(self, data: bytes) -> None:
        """Start an exchange: forget the previous response, write the request when the loop's turn ends
        (``outbox``). A request that did not get to the socket leaves ``RequestNotSentError`` in
        ``error``: at once when the connection is known closed, else once the write was tried."""
        self._reset()
        transport = self.transport
        if self.paused:
            self.paused = False
            if not self.closed and transport is not None:
                transport.resume_reading()
        if self.closed or transport is None or transport.is_closing():
            self.error = RequestNotSentError("the connection was closed before the request was written")
            return
        self.outbox.write(transport, data, self, self.client.in_flight() < 2)

    def unsent(self) -> None:
        """The held request was not written: the connection closed before (a server closing an idle
        connection as it was taken) or broke in the write (the transport writes at once what the socket
        takes, and closes itself if that fails: then not one byte reached the server)."""
        if self.received or self.done:
            return
        if self.error is None or isinstance(self.error, NoResponseError):  # connection_lost's guess
            self.error = RequestNotSentError("the connection broke before the request was written")
        self._wake()

    def abort(self) -> None:
        """Close the connection now, whatever it was doing."""
        if self.transport is not None:
            self.transport.close()
        self.closed = True
        self.deadline.stop()

    def wait(self, timeout_s: float, head: bool = False) -> asyncio.Future[None]:
        """Resolved when something happens on the connection; fails after ``timeout_s`` without anything
        (``head``: while the response's head is awaited). A future, awaited as it is: no coroutine per
        wait. The deadline moves with each wait, on one timer (``deadline.Deadline``)."""
        waiter = self.waiter = self.loop.create_future()
        self.deadline.start(timeout_s, head)
        return waiter

    def _expire(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.deadline.head:
            limit_s = self.client.response_timeout_s
            waiter.set_exception(ResponseTimeout(f"no response from the server within {limit_s:g} s of the request"))
        else:
            waiter.set_exception(ReadTimeout(f"no data from the server for {self.deadline.timeout_s:g} s"))

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> bytes:
        """Body bytes received and not yet read (decoded, when the body is compressed: then possibly
        empty, and some may stay for the next call)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        if self.decoder is not None:
            data = self._decode(data)
        if self.paused and self.buffered <= self.client.read_limit:
            self.paused = False
            if not self.closed:
                self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    def _decode(self, data: bytes) -> bytes:
        """Inflate at most ``read_limit`` bytes: what does not fit stays compressed for the next read,
        so a small compressed body cannot fill memory."""
        decoder = self.decoder
        assert decoder is not None
        limit = self.client.read_limit
        try:
            out = decoder.decompress(data, limit)
        except zlib.error as exc:
            if not self.raw_deflate_possible:
                raise ProtocolError(f"the compressed body does not decode: {exc}") from exc
            # "deflate" sent as a raw deflate stream, as some servers do (known by its first bytes)
            decoder = self.decoder = zlib.decompressobj(wbits=-15)
            try:
                out = decoder.decompress(data, limit)
            except zlib.error as raw_exc:
                raise ProtocolError(f"the compressed body does not decode: {exc}") from raw_exc
        self.raw_deflate_possible = False
        tail = decoder.unconsumed_tail
        if tail:
            self.chunks = [tail]
            self.buffered = len(tail)
        return out

    def _fail(self, error: HttpError) -> None:
        if self.error is None and not self.done:
            self.error = error
        self.keep_alive = False
        self.abort()
        self._wake()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
        self.client.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.arrived = perf_counter()
        if not self.busy or self.done:
            # Bytes nobody asked for: the connection can no longer be trusted for another request.
            self.keep_alive = False
            self.abort()
            return
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("the server switched protocols"))
            return
        except httptools.HttpParserError as exc:
            raised = exc.__context__  # a callback's own error, when one stopped the parser
            self._fail(raised if isinstance(raised, ProtocolError) else ProtocolError(f"invalid HTTP response: {exc}"))
            return
        if not self.head and self.received > self.client.max_head_bytes:
            self._fail(ProtocolError(f"response head larger than {self.client.max_head_bytes} bytes"))
            return
        if self.buffered > self.client.read_limit and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        # The listener takes body bytes only while the body goes on: its end (or a failure) is the
        # waiter's to see.
        listener, waiter = self.listener, self.waiter
        taking = waiter is not None and not waiter.done() and len(self.chunks) > 0 and not self.done
        if taking and listener is not None and listener():
            return
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost says what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.deadline.stop()
        self.client.connections.discard(self)
        if not self.busy:
            self.client.lost(self)
            return
        if not self.done and self.error is None:
            if self.head and self.until_eof and exc is None:
                self.done = True  # a body delimited by the end of the connection
            else:
                what = f"the server closed the connection ({exc})" if exc else "the server closed the connection"
                if self.received:
                    self.error = RemoteClosed(f"{what} before the response was complete", before_response=False)
                else:
                    self.error = NoResponseError(
                        f"{what} after the request was sent, before any response: it may have been run"
                    )
        self.keep_alive = False
        self._wake()

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.done:  # a second response to one request: stop parsing, the connection is not reused
            raise ProtocolError("data after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > self.client.max_head_bytes:
            raise ProtocolError(f"response head larger than {self.client.max_head_bytes} bytes")
        # After the head, fields are a chunked body's trailers: kept apart, never taken as headers.
        (self.trailers if self.head else self.raw_headers).append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: informational, the real response follows
            self.informational = True
            self.raw_headers = []
            return
        self.status = status
        self.head = True
        self.head_size = 0  # trailers get a limit of their own
        framed = False
        for name, value in self.raw_headers:
            lowered = name.lower()
            chunked = lowered == b"transfer-encoding" and value.lower().find(b"chunked") >= 0  # find: values.calls
            if lowered == b"content-length" or chunked:
                framed = True
            elif lowered == b"content-type":
                self.content_type = value
            elif lowered == b"content-encoding":
                self.decoder = _decoder(value)
                self.raw_deflate_possible = value.strip().lower() == b"deflate"
            elif lowered == b"keep-alive":
                timeout_s = _keep_alive_s(value)
                if timeout_s is not None:
                    # Leave a margin so the server never closes a connection just as it is reused.
                    self.idle_limit = min(self.idle_limit, timeout_s - min(1.0, timeout_s / 2))
        self.until_eof = not framed

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.keep_alive = self.parser.should_keep_alive() and not self.closing
        self.done = True

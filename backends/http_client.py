"""A small asyncio HTTP/1.1 client: exactly what the engine adapters need, and cheap per request.

One ``HttpClient`` talks to one origin (scheme, host, port) through a keep-alive
pool: idle connections are reused last-in first-out, at most ``max_connections``
are open at once, and requests beyond that wait for a free one. A request is a
``POST`` of a JSON body or a ``GET``; its ``Response`` has the status, the headers
(case-insensitive), the trailers apart, and a body read as it arrives. Responses
are parsed with ``httptools`` (llhttp) in an ``asyncio.Protocol``: bodies framed by
Content-Length, chunked, or ended by the server closing the connection.

- At most one delivery: a request whose bytes all went to the socket is never
  sent again. Only a request that cannot have reached the server (its pooled
  connection was found closed, or broke during the write) is sent once more, on a
  new connection; each such retry is counted in ``retries`` and logged. A
  connection closed after the request was written and before any response byte
  raises ``NoResponseError``: the engine may have run the request.
- Reuse: an idle connection is reused only within ``idle_timeout_s`` (kept below
  the engines' keep-alive, so that the server never closes a connection just as
  it is reused) and within the server's own ``Keep-Alive: timeout``; older ones
  are closed. ``Connection: close`` is honoured, and a pooled connection with
  anything to read (an end of file, a reset) is closed instead of reused.
- Deadlines per phase, each a ``TimeoutError`` subclass: connecting
  (``connect_timeout_s``), the response's head after the request was written
  (``response_timeout_s``), and the longest silence between body bytes
  (``read_timeout_s``).
- Bounds: the response head (and trailers) at ``max_head_bytes``; body bytes
  held unread at ``read_limit`` (reading from the socket pauses beyond it).
- Encoding: ``Accept-Encoding: identity`` is sent; a gzip or deflate body sent
  anyway is decoded incrementally as it is read, anything else is a
  ``ProtocolError``.
- Releasing: a response received to the end gives its connection back to the
  pool; a response left early (cancellation, errors) closes its connection,
  which is how engines learn that a request was abandoned.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import select
import ssl
import time
import zlib
from collections.abc import Iterator, Mapping
from urllib.parse import quote, urlsplit

import httptools

DEFAULT_READ_LIMIT = 8 * 1024 * 1024
DEFAULT_HEAD_LIMIT = 64 * 1024
DEFAULT_IDLE_TIMEOUT_S = 4.0
"""Below uvicorn's default keep-alive (5 s), the shortest among the engines' servers."""

# Servers close idle connections on timers of a second or more: a connection idle for less needs no
# look at its socket (a system call) before it is reused.
_PEEK_AFTER_S = 1.0

log = logging.getLogger("enginegate.http")


class HttpError(OSError):
    """Everything this client raises about the network or the server's answer."""


class ConnectError(HttpError):
    """No connection could be made to the server."""


class RequestNotSentError(ConnectError):
    """The request cannot have reached the server (its connection was closed, or broke while the
    request was written): safe to send again, here or elsewhere."""


class ConnectTimeout(HttpError, TimeoutError):
    """Connecting took longer than ``connect_timeout_s``."""


class ResponseTimeout(HttpError, TimeoutError):
    """The response's head did not arrive within ``response_timeout_s`` of the request."""


class ReadTimeout(HttpError, TimeoutError):
    """The server sent nothing for ``read_timeout_s`` while the body was awaited."""


class ProtocolError(HttpError):
    """The server's answer was not valid HTTP/1.1, too large, cut short or undecodable."""


class RemoteClosed(ProtocolError):
    """The server closed the connection before the response was complete."""

    def __init__(self, message: str, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response
        """Not one byte of the response had arrived."""


class NoResponseError(RemoteClosed):
    """The request was sent whole and the connection closed before any response byte: the server
    may have run it (never sent again by this client)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, before_response=True)


class Headers(Mapping[str, str]):
    """Response header fields by case-insensitive name; repeated fields joined with ``", "``."""

    __slots__ = ("_fields",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        fields: dict[str, str] = {}
        for name, value in raw:
            key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
            fields[key] = f"{fields[key]}, {text}" if key in fields else text
        self._fields = fields

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


def tls_context(
    ca_file: str | None = None, verify: bool = True, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """Client TLS settings for https engines: ``ca_file`` replaces the system's CA store,
    ``verify=False`` accepts any certificate (and name), ``cert_file`` (with ``key_file`` unless the
    key is in it) is presented to servers that ask for a client certificate. Reads the files: call it
    where configuration is loaded, not per request."""
    context = ssl.create_default_context(cafile=ca_file)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


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


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the state of the response being received on it."""

    def __init__(self, client: HttpClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        """Its event loop, kept: ``asyncio.get_running_loop()`` costs a system call per call."""
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
        self.arrived = 0.0
        """``time.perf_counter()`` when bytes last came in (before parsing them)."""
        self.idle_since = 0.0
        """``loop.time()`` when it went back to the pool."""
        self._reset()

    def _reset(self) -> None:
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
        """Start an exchange: forget the previous response, write the request. A request that did not
        get to the socket leaves ``RequestNotSentError`` in ``error``."""
        self._reset()
        transport = self.transport
        if self.paused:
            self.paused = False
            if not self.closed and transport is not None:
                transport.resume_reading()
        if self.closed or transport is None or transport.is_closing():
            self.error = RequestNotSentError("the connection was closed before the request was written")
            return
        transport.write(data)
        # The transport writes at once what the socket takes and closes itself if that fails (a reset,
        # a broken pipe): then not one byte of this request reached the server.
        if transport.is_closing():
            self.error = RequestNotSentError("the connection broke while the request was written")

    def abort(self) -> None:
        """Close the connection now, whatever it was doing."""
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    async def wait(self, timeout_s: float, head: bool = False) -> None:
        """Until something happens on the connection, or ``timeout_s`` without anything (``head``:
        while the response's head is awaited)."""
        loop = self.loop
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(timeout_s, self._expire, waiter, timeout_s, head)
        try:
            await waiter
        finally:
            self.waiter = None
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[None], timeout_s: float, head: bool) -> None:
        if waiter.done():
            return
        if head:
            limit_s = self.client.response_timeout_s
            waiter.set_exception(ResponseTimeout(f"no response from the server within {limit_s:g} s of the request"))
        else:
            waiter.set_exception(ReadTimeout(f"no data from the server for {timeout_s:g} s"))

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
        self.arrived = time.perf_counter()
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
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost says what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.connections.discard(self)
        if not self.busy:
            self.client._lost(self)
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
            if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
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


class Response:
    """One response: status and headers at once, the body as it arrives. Call ``release`` when done."""

    __slots__ = ("_client", "_conn", "_content_type", "_headers", "_raw_headers", "_trailers", "status")

    def __init__(self, client: HttpClient, conn: _Connection) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.status = conn.status
        self._raw_headers = conn.raw_headers
        self._trailers = conn.trailers
        self._content_type = conn.content_type
        self._headers: Headers | None = None

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self._raw_headers)
        return self._headers

    @property
    def trailers(self) -> Headers:
        """A chunked body's trailer fields received so far (all of them once the body is read)."""
        return Headers(self._trailers)

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters (``"text/event-stream"``); ``""`` if none."""
        return self._content_type.partition(b";")[0].strip().lower().decode("latin-1")

    @property
    def arrived_at(self) -> float:
        """``time.perf_counter()`` when the server's bytes last arrived: the end of a wait for them,
        whatever the event loop did before the reader resumed."""
        return self._conn.arrived if self._conn is not None else 0.0

    @property
    def complete(self) -> bool:
        """The whole body has been received (not necessarily read)."""
        return self._conn is None or self._conn.done

    async def read_chunk(self) -> bytes:
        """The body bytes received since the last call, waiting for some if none are; ``b""`` at the end."""
        conn = self._conn
        if conn is None:
            raise ProtocolError("the response was released")
        try:
            while True:
                if conn.chunks:
                    data = conn.take()
                    if data:
                        return data
                    continue  # compressed bytes that decoded to nothing yet
                if conn.done:
                    if conn.decoder is not None and not conn.decoder.eof:
                        raise ProtocolError("the compressed body was cut short")
                    return b""
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self._client.read_timeout_s)
        except BaseException:
            self.close()
            raise

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with this response: its connection goes back to the pool if the response came in whole
        and the server keeps the connection open, and is closed otherwise."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._release(conn)

    def close(self) -> None:
        """Done with this response and its connection: the server sees the connection close."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
            self._client._release(conn)


class HttpClient:
    """Keep-alive HTTP/1.1 to one origin; ``url`` may carry a path prefix for every request."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 100,
        connect_timeout_s: float = 2.0,
        response_timeout_s: float = 300.0,
        read_timeout_s: float = 300.0,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        read_limit: int = DEFAULT_READ_LIMIT,
        max_head_bytes: int = DEFAULT_HEAD_LIMIT,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if tls else 80)
        self._ssl: ssl.SSLContext | None = (ssl_context or tls_context()) if tls else None
        self._prefix = parts.path.rstrip("/")
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.response_timeout_s = response_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.read_limit = read_limit
        self.max_head_bytes = max_head_bytes
        host = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None and parts.port != (443 if tls else 80):
            host = f"{host}:{parts.port}"
        fixed = f"host: {host}\r\naccept-encoding: identity\r\n"
        if api_key:
            fixed += f"authorization: Bearer {api_key}\r\n"
        self._fixed = fixed.encode("latin-1")
        self._heads: dict[tuple[str, str], bytes] = {}
        self.connections: set[_Connection] = set()
        """Every open connection, idle or busy."""
        self._idle: list[_Connection] = []
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self._slots = 0
        """Connections open or being opened, counted against ``max_connections``."""
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False
        self.retries = 0
        """Requests sent once more on a new connection because they could not have reached the server."""
        self.discarded = 0
        """Idle connections closed instead of reused: past their idle limit, or closed by the server."""

    async def request(self, method: str, path: str, body: bytes | None = None, headers: bytes = b"") -> Response:
        """Send ``method path`` (a JSON ``body`` when given; ``headers``: extra ``name: value\\r\\n``
        lines) and return once the response's head is in. Raises ``ConnectError`` (its subclass
        ``RequestNotSentError`` when the request cannot have reached the server), ``ConnectTimeout``,
        ``ResponseTimeout``, ``NoResponseError`` or another ``ProtocolError``."""
        head = self._heads.get((method, path))
        if head is None:
            head = self._head(method, path)
        if body is None:
            data = b"%s%s\r\n" % (head, headers) if headers else head + b"\r\n"
        else:
            data = b"%s%scontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                head,
                headers,
                len(body),
                body,
            )
        conn, reused = await self._acquire()
        closing = _CLOSE in headers
        try:
            conn.send(data)
            conn.closing = closing  # after send(), which starts the exchange afresh
            if conn.error is not None and reused:
                # Nothing of this request reached the server: once more, on a new connection.
                self.retries += 1
                log.warning(
                    "%s %s to %s:%d sent again on a new connection: %s", method, path, self.host, self.port, conn.error
                )
                conn.abort()
                conn = await self._pass_slot(conn)
                conn.send(data)
                conn.closing = closing
            await self._response_head(conn)
        except BaseException:
            conn.abort()
            self._release(conn)
            raise
        return Response(self, conn)

    def _head(self, method: str, path: str) -> bytes:
        target = quote(self._prefix + path, safe="/:@!$&'()*+,;=?%~-._")
        head = f"{method} {target} HTTP/1.1\r\n".encode("ascii") + self._fixed
        if len(self._heads) < 256:
            self._heads[(method, path)] = head
        return head

    async def _response_head(self, conn: _Connection) -> None:
        if conn.head:
            return
        loop = conn.loop
        deadline = loop.time() + self.response_timeout_s
        while not conn.head:
            if conn.error is not None:
                raise conn.error
            await conn.wait(deadline - loop.time(), head=True)

    async def aclose(self) -> None:
        """Close every connection, busy ones included; requests waiting for a connection fail."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectError("the client was closed"))
        await asyncio.sleep(0)  # the transports finish closing their sockets

    # The pool

    async def _acquire(self) -> tuple[_Connection, bool]:
        """A connection for one request, and whether it was used before."""
        if self.closed:
            raise ConnectError("the client was closed")
        idle = self._idle
        if idle:
            now = idle[-1].loop.time()
            while idle:
                conn = idle.pop()
                conn.busy = True
                if conn.usable(now):
                    return conn, True
                self.discarded += 1
                conn.abort()
                self._give_up_slot(conn)
        if self._slots < self.max_connections:
            self._slots += 1
            return await self._open_in_slot(), False
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            got = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a connection or a slot just as cancelled
                handed = waiter.result()
                if handed is None:
                    self._free_slot()
                else:
                    self._release(handed)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if got is None:
            return await self._open_in_slot(), False
        if got.reusable:
            return got, True
        got.abort()
        return await self._pass_slot(got), False

    async def _open_in_slot(self) -> _Connection:
        """A new connection in a slot already counted."""
        try:
            conn = await self._connect()
        except BaseException:
            self._free_slot()
            raise
        conn.holds_slot = True
        return conn

    async def _pass_slot(self, old: _Connection) -> _Connection:
        """A new connection in the slot of ``old`` (closed), which gives it up."""
        if old.holds_slot:
            old.holds_slot = False
        else:
            self._slots += 1
        return await self._open_in_slot()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(self, loop)
        conn.busy = True
        origin = f"{self.host}:{self.port}"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(
                    lambda: conn, self.host, self.port, ssl=self._ssl, server_hostname=self.host if self._ssl else None
                )
        except TimeoutError as exc:
            raise ConnectTimeout(f"connecting to {origin} took over {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {origin}: {exc}") from exc
        if self.closed:
            conn.abort()
            raise ConnectError("the client was closed")
        return conn

    def _release(self, conn: _Connection) -> None:
        """The owner is done with ``conn``: to the next waiter or the idle list if it can serve again."""
        if conn.reusable and not self.closed:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(conn)
                    return
            conn.busy = False
            loop = conn.loop
            conn.idle_since = now = loop.time()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = loop.call_at(now + conn.idle_limit, self._sweep)
            return
        conn.abort()
        self._give_up_slot(conn)

    def _sweep(self) -> None:
        """Close idle connections past their idle limit, so that none outlives the server's keep-alive
        (which would close it, perhaps just as a request is written)."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep, next_at = [], float("inf")
        for conn in self._idle:
            expires = conn.idle_since + conn.idle_limit
            if expires <= now:
                self.discarded += 1
                conn.abort()
                self._give_up_slot(conn)
            else:
                keep.append(conn)
                next_at = min(next_at, expires)
        self._idle[:] = keep
        if keep and not self.closed:
            self._sweeper = loop.call_at(next_at, self._sweep)

    def _lost(self, conn: _Connection) -> None:
        """An idle connection closed (the server's keep-alive timeout, usually)."""
        if conn in self._idle:
            self._idle.remove(conn)
        self._give_up_slot(conn)

    def _give_up_slot(self, conn: _Connection) -> None:
        if conn.holds_slot:
            conn.holds_slot = False
            self._free_slot()

    def _free_slot(self) -> None:
        """One connection fewer: a waiting request may open one."""
        self._slots -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._slots += 1
                waiter.set_result(None)
                return

    def __repr__(self) -> str:
        return f"HttpClient({self.host}:{self.port}, {len(self.connections)} open, {len(self._idle)} idle)"

    def stats(self) -> dict[str, int]:
        """For tests and debugging: connections open, slots counted, idle, and requests waiting."""
        return {
            "open": len(self.connections),
            "slots": self._slots,
            "idle": len(self._idle),
            "waiting": len(self._waiters),
        }

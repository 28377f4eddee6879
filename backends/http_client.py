"""A small asyncio HTTP/1.1 client: exactly what the engine adapters need, and cheap per request.

One ``HttpClient`` talks to one origin (scheme, host, port) through a keep-alive
pool: idle connections are reused last-in first-out, at most ``max_connections``
are open at once, and requests beyond that wait for a free one. A request is a
``POST`` of a JSON body or a ``GET``; its ``Response`` has the status, the headers
(case-insensitive) and a body read as it arrives. Responses are parsed with
``httptools`` (llhttp) in an ``asyncio.Protocol``: bodies framed by
Content-Length, chunked, or ended by the server closing the connection.

- Flow control: reading from the socket pauses while more than ``read_limit``
  body bytes wait unread, and resumes once the reader takes them.
- Timeouts: connecting (``connect_timeout_s``) and each wait for bytes from the
  server (``read_timeout_s``) raise ``TimeoutError`` subclasses.
- Stale connections: a pooled connection the server closed while idle is never
  handed out; if a request on a reused connection still finds it closed before
  any response byte, the request is sent once more on a new connection.
- Releasing: a response received to the end gives its connection back to the
  pool; a response left early (cancellation, errors) closes its connection,
  which is how engines learn that a request was abandoned.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Iterator, Mapping
from urllib.parse import quote, urlsplit

import httptools

DEFAULT_READ_LIMIT = 8 * 1024 * 1024


class HttpError(OSError):
    """Everything this client raises about the network or the server's answer."""


class ConnectError(HttpError):
    """No connection could be made to the server."""


class ConnectTimeout(HttpError, TimeoutError):
    """Connecting took longer than ``connect_timeout_s``."""


class ReadTimeout(HttpError, TimeoutError):
    """The server sent nothing for ``read_timeout_s`` while a response was awaited."""


class ProtocolError(HttpError):
    """The server's answer was not valid HTTP/1.1, too large, or cut short."""


class RemoteClosed(ProtocolError):
    """The server closed the connection before the response was complete."""

    def __init__(self, message: str, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response
        """Not one byte of the response had arrived: the server may never have seen the request."""


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


def _expire(waiter: asyncio.Future[None], timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(ReadTimeout(f"no data from the server for {timeout_s:g} s"))


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the state of the response being received on it."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
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
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.head = False
        self.done = False
        self.keep_alive = False
        self.until_eof = False
        self.informational = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.received = 0
        self.error: HttpError | None = None

    @property
    def reusable(self) -> bool:
        return (
            self.done
            and self.keep_alive
            and self.error is None
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def send(self, data: bytes) -> None:
        """Start an exchange: forget the previous response, write the request."""
        self._reset()
        if self.paused:
            self.paused = False
            if not self.closed:
                self.transport.resume_reading()  # type: ignore[union-attr]
        if self.closed or self.transport is None or self.transport.is_closing():
            self.error = RemoteClosed("the connection was closed before the request was sent", True)
            return
        self.transport.write(data)

    def abort(self) -> None:
        """Close the connection now, whatever it was doing."""
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    async def wait(self) -> None:
        """Until something happens on the connection, or ``read_timeout_s`` without anything."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timeout_s = self.client.read_timeout_s
        timer = loop.call_later(timeout_s, _expire, waiter, timeout_s)
        try:
            await waiter
        finally:
            self.waiter = None
            timer.cancel()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> bytes:
        """Every body byte received and not yet read."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        if self.paused:
            self.paused = False
            if not self.closed:
                self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    def _fail(self, error: HttpError) -> None:
        if self.error is None and not self.done:
            self.error = error
        self.keep_alive = False
        self.abort()
        self._wake()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
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
        limit = self.client.read_limit
        if not self.head and self.received > limit:
            self._fail(ProtocolError(f"response head larger than {limit} bytes"))
            return
        if self.buffered > limit and not self.paused:
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
                where = "before the response" if not self.received else "before the response was complete"
                self.error = RemoteClosed(f"{what} {where}", before_response=not self.received)
        self.keep_alive = False
        self._wake()

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.done:  # a second response to one request: stop parsing, the connection is not reused
            raise ProtocolError("data after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        self.head_size += len(name) + len(value) + 4
        if self.head_size > self.client.read_limit:
            raise ProtocolError(f"response head larger than {self.client.read_limit} bytes")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: informational, the real response follows
            self.informational = True
            self.raw_headers = []
            return
        self.status = status
        self.head = True
        framed = False
        for name, value in self.raw_headers:
            lowered = name.lower()
            if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
                framed = True
        self.until_eof = not framed

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


class Response:
    """One response: status and headers at once, the body as it arrives. Call ``release`` when done."""

    __slots__ = ("_client", "_conn", "_headers", "_raw_headers", "status")

    def __init__(self, client: HttpClient, conn: _Connection) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self.status = conn.status
        self._raw_headers = conn.raw_headers
        self._headers: Headers | None = None

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self._raw_headers)
        return self._headers

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
                    return conn.take()
                if conn.done:
                    return b""
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
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
        read_timeout_s: float = 300.0,
        read_limit: int = DEFAULT_READ_LIMIT,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if tls else 80)
        self._ssl: ssl.SSLContext | None = (ssl_context or ssl.create_default_context()) if tls else None
        self._prefix = parts.path.rstrip("/")
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.read_limit = read_limit
        host = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None and parts.port != (443 if tls else 80):
            host = f"{host}:{parts.port}"
        fixed = f"host: {host}\r\n"
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
        self.closed = False

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """Send ``method path`` (a JSON ``body`` when given) and return once the response's head is in.
        Raises ``ConnectError``, ``ConnectTimeout``, ``ReadTimeout`` or ``ProtocolError``."""
        head = self._heads.get((method, path))
        if head is None:
            head = self._head(method, path)
        if body is None:
            data = head + b"\r\n"
        else:
            data = b"%scontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (head, len(body), body)
        conn, reused = await self._acquire()
        try:
            try:
                conn.send(data)
                await self._response_head(conn)
            except RemoteClosed as exc:
                if not (reused and exc.before_response):
                    raise
                # The server closed an idle connection just as it was reused: once more on a new one.
                conn.abort()
                conn = await self._pass_slot(conn)
                conn.send(data)
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

    @staticmethod
    async def _response_head(conn: _Connection) -> None:
        while not conn.head:
            if conn.error is not None:
                raise conn.error
            await conn.wait()

    async def aclose(self) -> None:
        """Close every connection, busy ones included; requests waiting for a connection fail."""
        self.closed = True
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
        while idle:
            conn = idle.pop()
            conn.busy = True
            if not conn.closed and not conn.transport.is_closing():  # type: ignore[union-attr]
                return conn, True
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
        conn = _Connection(self)
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
            self._idle.append(conn)
            return
        conn.abort()
        self._give_up_slot(conn)

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

"""The keep-alive pool to one origin: ``HttpClient``, the only thing adapters build."""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from urllib.parse import quote, urlsplit

from backends.httpclient.connection import _CLOSE, Connection
from backends.httpclient.errors import (
    ConnectError,
    ConnectTimeout,
    RequestNotSentError,
)
from backends.httpclient.outbox import Outbox
from backends.httpclient.response import Response
from values.calls import running_loop

DEFAULT_READ_LIMIT = 8 * 1024 * 1024
DEFAULT_HEAD_LIMIT = 64 * 1024
DEFAULT_IDLE_TIMEOUT_S = 4.0
"""Below uvicorn's default keep-alive (5 s), the shortest among the engines' servers."""

log = logging.getLogger("enginegate.http")


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
        self.connections: set[Connection] = set()
        """Every open connection, idle or busy."""
        self._idle: list[Connection] = []
        self._waiters: collections.deque[asyncio.Future[Connection | None]] = collections.deque()
        self._slots = 0
        """Connections open or being opened, counted against ``max_connections``."""
        self._sweeper: asyncio.TimerHandle | None = None
        self._outbox: Outbox | None = None
        """Its connections' requests, written when the loop's turn ends (made with the first connection)."""
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
        closing = headers.find(_CLOSE) >= 0  # not ``in``: see values.calls
        try:
            conn.send(data)
            conn.closing = closing  # after send(), which starts the exchange afresh
            try:
                await self._response_head(conn)
            except RequestNotSentError as exc:
                if not reused:
                    raise
                # Nothing of this request reached the server: once more, on a new connection.
                self.retries += 1
                log.warning(
                    "%s %s to %s:%d sent again on a new connection: %s", method, path, self.host, self.port, exc
                )
                conn.abort()
                conn = await self._pass_slot(conn)
                conn.send(data)
                conn.closing = closing
                await self._response_head(conn)
        except BaseException:
            conn.abort()
            self.release(conn)
            raise
        return Response(self, conn)

    def _head(self, method: str, path: str) -> bytes:
        target = quote(self._prefix + path, safe="/:@!$&'()*+,;=?%~-._")
        head = f"{method} {target} HTTP/1.1\r\n".encode("ascii") + self._fixed
        if len(self._heads) < 256:
            self._heads[(method, path)] = head
        return head

    async def _response_head(self, conn: Connection) -> None:
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

    def in_flight(self) -> int:
        return len(self.connections) - len(self._idle)

    async def _acquire(self) -> tuple[Connection, bool]:
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
        waiter: asyncio.Future[Connection | None] = running_loop().create_future()
        self._waiters.append(waiter)
        try:
            got = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a connection or a slot just as cancelled
                handed = waiter.result()
                if handed is None:
                    self._free_slot()
                else:
                    self.release(handed)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if got is None:
            return await self._open_in_slot(), False
        if got.reusable:
            return got, True
        got.abort()
        return await self._pass_slot(got), False

    async def _open_in_slot(self) -> Connection:
        """A new connection in a slot already counted."""
        try:
            conn = await self._connect()
        except BaseException:
            self._free_slot()
            raise
        conn.holds_slot = True
        return conn

    async def _pass_slot(self, old: Connection) -> Connection:
        """A new connection in the slot of ``old`` (closed), which gives it up."""
        if old.holds_slot:
            old.holds_slot = False
        else:
            self._slots += 1
        return await self._open_in_slot()

    async def _connect(self) -> Connection:
        loop = running_loop()
        outbox = self._outbox
        if outbox is None or outbox.loop is not loop:
            outbox = self._outbox = Outbox(loop)
        conn = Connection(self, loop, outbox)
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

    def release(self, conn: Connection) -> None:
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
        loop = running_loop()
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

    def lost(self, conn: Connection) -> None:
        """An idle connection closed (the server's keep-alive timeout, usually)."""
        if conn in self._idle:
            self._idle.remove(conn)
        self._give_up_slot(conn)

    def _give_up_slot(self, conn: Connection) -> None:
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

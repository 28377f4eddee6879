"""uvicorn's httptools protocol with the gateway's connection limits.

It stamps each request's first parsed byte (``x-enginegate-overhead-ms`` counts from there) and
bounds what one connection can hold or stall: request head size, header count, URL length, time to
send the head (slowloris), body rate (trickle), idle time, open connections, and how long a client
may leave its output buffer full. It refuses non-JSON POSTs and unknown ``Host`` names before any
ASGI task exists. Refusals are OpenAI error JSON. One timer per process (``Guard.sweep``) checks
every connection's deadline, so a request costs a few attribute stores, not a timer of its own.
"""

from __future__ import annotations

import array
import fcntl
import itertools
import logging
import random
import termios
from typing import TYPE_CHECKING, Any, Protocol, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from backends.httpclient.outbox import Held, Outbox
from gateway.config import GatewayConfig, ServerConfig
from gateway.http.bodies import json_post, yaml_post
from gateway.http.coalesce import HeadWithBody
from gateway.http.errors import ApiError
from gateway.http.limits import HEALTH_ROOM, Limits, host_name
from values.calls import perf_counter

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("enginegate.http")

RECEIVED = "enginegate.received"
"""Scope key: ``time.perf_counter()`` when the request's first byte was parsed."""

LINGER_S = 1.0
"""After a refusal, input is read and dropped this long so the client can read the answer."""
_HEALTH = frozenset((b"/healthz", b"/readyz"))
_GUARD = "enginegate_guard"

# Connection phases, checked by the sweep.
_IDLE, _HEAD, _BODY, _BUSY, _LINGER = range(5)
_EVICT_TRIES = 64
"""Idle connections looked at (oldest first) for one to close when a new one finds the server full."""


class _Refused(Exception):
    """Raised inside a parser callback after the refusal was written: stops the parser."""


def _refusal(status: int, message: str, code: str, type: str = "invalid_request_error") -> ApiError:  # noqa: A002
    return ApiError(status, message, type=type, code=code)


def busy() -> ApiError:
    return ApiError(
        503, "The gateway has too many open connections; retry shortly.", type="api_error",
        code="too_many_connections", retry_after=1.0,
    )  # fmt: skip


def response(err: ApiError) -> bytes:
    """``err`` as a whole HTTP/1.1 response that closes the connection."""
    body = err.json()
    extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers().items())
    rid = f"{random.getrandbits(128):032x}".encode()
    return b"".join(
        (
            STATUS_LINE[err.status], b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
            b"\r\nconnection: close\r\nx-request-id: ", rid, b"\r\n", extra, b"\r\n", body,
        )
    )  # fmt: skip


class _Counted(Protocol):
    def other_request(self, route: str, status: int) -> None: ...


class Served(Protocol):
    """What the connection layer reads of the gateway it serves (``gateway.state.AppState``): its
    server settings, whether it is draining, and the counter of the responses it writes itself."""

    draining: bool

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def metrics(self) -> _Counted: ...


def _app_state(app: Any) -> Served | None:
    """The gateway's state behind uvicorn's middleware wrappers (None for another app)."""
    for _ in range(8):
        state = getattr(app, "state", None)
        if state is not None and hasattr(state, "draining"):
            return state  # type: ignore[no-any-return]
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class Guard:
    """The limits and the one deadline sweep shared by every connection of a server."""

    def __init__(self, limits: Limits, state: Served | None, server_state: ServerState, loop: Any) -> None:
        self.limits = limits
        self.state = state
        self.connections = server_state.connections
        self.idle: dict[GatewayHttpProtocol, None] = {}
        """Connections waiting for a request, the longest waiting first (a dict keeps insertion order)."""
        self.loop: asyncio.AbstractEventLoop = loop
        self.outbox = Outbox(loop)
        """Every connection's writes, sent when the loop's turn ends (``backends.httpclient.outbox``)."""
        self._verdicts: dict[bytes, bool] = {}
        shortest = min(limits.header_timeout_s, limits.body_timeout_s, limits.keep_alive_timeout_s)
        self.tick_s = max(0.05, min(1.0, shortest / 4, limits.write_timeout_s / 4))
        self.loop.call_later(self.tick_s, self.sweep)

    @classmethod
    def of(cls, config: Config, server_state: ServerState, loop: Any) -> Guard:
        guard: Guard | None = getattr(server_state, _GUARD, None)
        if guard is None:
            state = _app_state(config.loaded_app)
            server = state.config.server if state is not None else ServerConfig()
            guard = cls(Limits.of(server, config.host), state, server_state, loop)
            setattr(server_state, _GUARD, guard)
        return guard

    @property
    def draining(self) -> bool:
        return self.state is not None and self.state.draining

    def host_allowed(self, value: bytes) -> bool:
        ok = self._verdicts.get(value)
        if ok is None:
            name = host_name(value)
            hosts = self.limits.hosts
            ok = hosts is None or name in hosts or any(name.endswith(s) for s in self.limits.host_suffixes)
            if len(self._verdicts) < 256:  # any number of names may be tried: remember only some
                self._verdicts[value] = ok
        return ok

    def sweep(self) -> None:
        now = perf_counter()
        for conn in list(self.connections):
            if isinstance(conn, GatewayHttpProtocol):
                conn.expire(now)
        self.loop.call_later(self.tick_s, self.sweep)

    def evict_idle(self) -> bool:
        """Close the connection that has waited longest for a request, to make room for a new one.

        One whose request has already arrived in the kernel but was not read yet is never closed: under
        a burst of connections, a client that connected and sent at once (a health check) would lose its
        request, answered by nothing (the sample this replaced picked such ones; CI caught it)."""
        for conn in itertools.islice(self.idle, _EVICT_TRIES):
            if not _unread(conn.transport):
                conn.leave(_LINGER)
                conn.transport.close()
                return True
        return False


def _unread(transport: asyncio.Transport) -> bool:
    """Whether bytes wait unread on the transport's socket (FIONREAD: nothing is consumed)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except OSError:
        return False
    return count[0] > 0


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.guard = Guard.of(config, server_state, self.loop)
        self.limits = self.guard.limits
        self.phase = _IDLE
        self.since = perf_counter()
        self._head_bytes = 0
        self._parsed_head = 0
        self._body_bytes = 0
        self._paused_at = 0.0
        self._paused_size = 0
        self._overflow = False
        """Beyond ``max_connections``: only the health routes are answered."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn's protocol and cycle, and the gateway's, all write through the held transport.
        super().connection_made(cast("asyncio.Transport", Held(transport, self.guard.outbox, self.tasks)))
        limits = self.limits
        transport.set_write_buffer_limits(high=limits.max_output_buffer_bytes)
        open_now = len(self.connections)
        if open_now > limits.max_connections and not self.guard.evict_idle():
            if open_now > limits.max_connections + HEALTH_ROOM:
                if self.guard.state is not None:
                    self.guard.state.metrics.other_request("protocol", 503)
                transport.write(response(busy()))  # before reading anything: holding it costs a descriptor
                transport.close()
                self.phase = _LINGER
                return
            self._overflow = True
        self.guard.idle[self] = None

    def rest(self, now: float) -> None:
        """The connection now waits for its next request (last in the line of those to close)."""
        self.phase = _IDLE
        self.since = now
        idle = self.guard.idle
        idle.pop(self, None)
        idle[self] = None

    def leave(self, phase: int) -> None:
        """From waiting for a request (or any phase) to ``phase``."""
        if self.phase == _IDLE:
            self.guard.idle.pop(self, None)
        self.phase = phase

    def connection_lost(self, exc: Exception | None) -> None:
        self.leave(_LINGER)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == _LINGER:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            return
        except httptools.HttpParserError as exc:
            if self.phase != _LINGER:  # not a refusal already written by a callback
                self.refuse(_refusal(400, f"Invalid HTTP request: {exc}", "invalid_http_request"))
            return
        if self.phase == _HEAD:  # the head is still arriving: bound what the parser holds for it
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self.refuse(self._head_too_large())

    def _head_too_large(self) -> ApiError:
        return _refusal(
            431, f"Request line and headers exceed {self.limits.max_header_bytes} bytes.", "request_header_too_large"
        )

    def refuse(self, err: ApiError) -> None:
        """Answer ``err`` and close, unless a response is already under way (then just close)."""
        cycle = self.cycle
        transport = self.transport
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() now says the client is gone
            cycle.message_event.set()
        self.leave(_LINGER)
        self.since = perf_counter()
        if answering or transport.is_closing():
            transport.close()
            return
        state = self.guard.state
        if state is not None:  # counted like every other response, under the route "protocol"
            state.metrics.other_request("protocol", err.status)
        transport.write(response(err))
        if transport.can_write_eof():
            transport.write_eof()  # input is still read (and dropped) for LINGER_S, then closed
        else:
            transport.close()

    # Parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        now = perf_counter()
        self.scope[RECEIVED] = now  # type: ignore[literal-required]
        self.leave(_HEAD)
        self.since = now
        self._head_bytes = 0
        self._parsed_head = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        # A whole head in one read never shows in data_received's count: the parsed size is checked too.
        self._parsed_head += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        err = self._check()
        if err is not None:
            self.refuse(err)
            raise _Refused
        self.phase = _BODY
        self.since = perf_counter()
        self._body_bytes = 0
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            cycle.transport = HeadWithBody(self.transport)  # type: ignore[assignment]
            if self._overflow or self.guard.draining:
                cycle.keep_alive = False  # draining: clients reconnect, elsewhere once /readyz has told

    def _check(self) -> ApiError | None:
        """The cheap checks of a complete head; None when it may go on."""
        headers = self.headers
        limits = self.limits
        if self._parsed_head + len(self.url) > limits.max_header_bytes:
            return self._head_too_large()
        if len(headers) > limits.max_headers:
            return _refusal(431, f"More than {limits.max_headers} request headers.", "too_many_headers")
        if len(self.url) > limits.max_url_bytes:
            return _refusal(414, f"URL longer than {limits.max_url_bytes} bytes.", "url_too_long")
        host = ctype = encoding = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"content-type":
                ctype = value
            elif name == b"content-encoding":
                encoding = value
        url = self.url
        if url[:1] != b"/" and url != b"*":  # absolute-form: a forward proxy's request, not ours
            return _refusal(400, "Request targets must be paths (this is not a forward proxy).", "invalid_target")
        if host is None and self.parser.get_http_version() == "1.1":
            return _refusal(400, "HTTP/1.1 requests must carry a Host header.", "missing_host")
        if host is not None and limits.hosts is not None and not self.guard.host_allowed(host):
            return _refusal(400, "This Host is not served here (server.allowed_hosts).", "invalid_host")
        if self._overflow and self.url.partition(b"?")[0] not in _HEALTH:
            return busy()
        if encoding is not None and encoding.strip().lower() != b"identity":
            return _refusal(415, "Compressed request bodies are not accepted (Content-Encoding).", "unsupported_media")
        if (
            ctype != b"application/json"
            and self.parser.get_method() == b"POST"
            and not json_post(ctype, headers)
            and not yaml_post(url, ctype)
        ):
            return _refusal(415, "Request bodies must be JSON (Content-Type: application/json).", "unsupported_media")
        return None

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:  # answered before the body was all in
            self.rest(perf_counter())
        else:
            self.phase = _BUSY
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.phase == _BUSY and (self.cycle is None or self.cycle.response_complete):
            self.rest(perf_counter())

    def pause_writing(self) -> None:
        self._paused_at = perf_counter()
        self._paused_size = self.transport.get_write_buffer_size()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._paused_at = 0.0
        super().resume_writing()

    def expire(self, now: float) -> None:
        """Called by the sweep: act on whichever deadline of this connection has passed."""
        limits = self.limits
        phase = self.phase
        if self._paused_at and (size := self.transport.get_write_buffer_size()) < self._paused_size:
            self._paused_at, self._paused_size = now, size  # it took some: reading slowly, not gone
        elif self._paused_at and now - self._paused_at > limits.write_timeout_s:
            # The client has accepted nothing for a whole timeout with its buffer full: treat it as
            # gone, so its request is cancelled and the engine stops working for it.
            log.info("closing a connection that stopped reading", extra={"client": self.client})
            self._paused_at = 0.0
            self.leave(_LINGER)
            self.transport.abort()
        elif phase == _IDLE:
            if now - self.since > limits.keep_alive_timeout_s:
                self.leave(_LINGER)
                self.transport.close()
        elif phase == _HEAD:
            if now - self.since > limits.header_timeout_s:
                self.refuse(_refusal(408, "The request headers took too long to arrive.", "request_timeout"))
        elif phase == _BODY:
            if now - self.since > limits.body_timeout_s + self._body_bytes / limits.body_min_rate:
                self.refuse(_refusal(408, "The request body arrived too slowly.", "request_timeout"))
        elif phase == _LINGER and now - self.since > LINGER_S:
            self.transport.close()

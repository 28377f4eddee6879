"""The connection cap fits the open-file limit with a descriptor for each request's engine connection:
counting only clients, 750 streams took all 1,024 descriptors and /healthz was reset (an outside audit)."""

from __future__ import annotations

import asyncio
import resource
import socket

import pytest
from uvicorn.server import ServerState

from gateway.config import ServerConfig
from gateway.http import protocol
from gateway.http.limits import FD_SPARE, HEALTH_ROOM, Limits, connection_cap
from gateway.http.protocol import Guard
from tests.compiled import interpreted_only


def test_each_connection_is_counted_with_its_engine_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 1024))
    cap = connection_cap(1000)
    assert 2 * cap + HEALTH_ROOM + FD_SPARE <= 1024
    assert cap == (1024 - HEALTH_ROOM - FD_SPARE) // 2


def test_a_limit_that_holds_them_all_keeps_the_configured_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1 << 20, 1 << 20))
    assert connection_cap(1000) == 1000
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY, 0))
    assert connection_cap(1000) == 1000


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def get_extra_info(self, name: str) -> socket.socket | None:
        return self.sock if name == "socket" else None

    def close(self) -> None:
        self.closed = True


class _Waiting:
    """A connection waiting for a request, as the guard sees it."""

    def __init__(self, sock: socket.socket) -> None:
        self.transport = _Transport(sock)
        self.left: int | None = None

    def leave(self, phase: int) -> None:
        self.left = phase


@interpreted_only(protocol, "the stand-in connections are not GatewayHttpProtocol objects")
def test_room_is_made_by_closing_the_longest_waiting_connection_that_sent_nothing() -> None:
    """Under a burst of new connections the one waiting longest is closed, unless its request has
    arrived unread: that one is answered, not dropped (a health check was, under an idle flood)."""
    loop = asyncio.new_event_loop()
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        guard = Guard(Limits.of(ServerConfig(), "127.0.0.1"), None, ServerState(), loop)
        oldest, older, newest = (_Waiting(server) for server, _ in pairs)
        for conn in (oldest, older, newest):
            guard.idle[conn] = None  # type: ignore[index]
        pairs[0][1].sendall(b"GET /healthz HTTP/1.1\r\n\r\n")  # the oldest has sent its request
        assert guard.evict_idle()
        assert not oldest.transport.closed and older.transport.closed and not newest.transport.closed
        del guard.idle[older]  # type: ignore[arg-type]  # what its leave() does in the protocol
        pairs[2][1].sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert not guard.evict_idle(), "every waiting connection has a request to read"
    finally:
        loop.close()
        for a, b in pairs:
            a.close()
            b.close()

"""What one gateway process may hold: its connection limits, the ``Host`` names it answers, and the
open-file limit sized to its connections. Read by the protocol (``gateway.http.protocol``) and the CLI."""

from __future__ import annotations

import gc
import logging
import resource
from dataclasses import dataclass

from gateway.config import ServerConfig

log = logging.getLogger("enginegate.http")

HEALTH_ROOM = 16
"""Connections beyond ``max_connections`` that may still ask for /healthz or /readyz."""
FD_SPARE = 256
"""File descriptors kept for everything but client connections (engine pools, logs, model files)."""


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int
    max_headers: int
    max_url_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    body_min_rate: int
    keep_alive_timeout_s: float
    max_connections: int
    max_output_buffer_bytes: int
    write_timeout_s: float
    hosts: frozenset[bytes] | None
    """Host names allowed (lower case, IPv6 in brackets); None: any."""
    host_suffixes: tuple[bytes, ...]

    @classmethod
    def of(cls, server: ServerConfig, bind_host: str) -> Limits:
        hosts, suffixes = allowed_hosts(server.allowed_hosts, bind_host)
        return cls(
            server.max_header_bytes, server.max_headers, server.max_url_bytes, server.header_timeout_s,
            server.body_timeout_s, server.body_min_rate_bytes_s, server.keep_alive_timeout_s,
            connection_cap(server.max_connections), server.max_output_buffer_bytes, server.write_timeout_s,
            hosts, suffixes,
        )  # fmt: skip


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


def allowed_hosts(names: list[str] | None, bind_host: str) -> tuple[frozenset[bytes] | None, tuple[bytes, ...]]:
    """The ``Host`` names to accept: exact names and ``*.domain`` suffixes (None: any host)."""
    if names is None:
        if not is_loopback(bind_host):
            return None, ()
        names = ["localhost", "127.0.0.1", "::1"]  # a page elsewhere cannot reach us by rebinding its name
    if "*" in names:
        return None, ()
    exact, suffixes = set(), []
    for name in (n.lower().strip() for n in names):
        if name.startswith("*."):
            suffixes.append(name[1:].encode())
        else:
            exact.add((f"[{name}]" if ":" in name and not name.startswith("[") else name).encode())
    return frozenset(exact), tuple(suffixes)


def host_name(value: bytes) -> bytes:
    """A ``Host`` header without its port, lower case."""
    value = value.strip().lower()
    if value.startswith(b"["):
        return value[: value.find(b"]") + 1]
    name, colon, _ = value.rpartition(b":")
    return name if colon else value


def _fds_for(connections: int) -> int:
    """Descriptors ``connections`` client connections may need: each can hold an engine connection
    while its request runs (750 streams took all 1,024 descriptors when only clients were counted)."""
    return 2 * connections + HEALTH_ROOM + FD_SPARE


def connection_cap(wanted: int) -> int:
    """``wanted``, or fewer when the open-file limit cannot hold that many connections."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or _fds_for(wanted) <= soft:
        return wanted
    cap = max(8, (soft - HEALTH_ROOM - FD_SPARE) // 2)
    log.warning("open-file limit %d holds only %d client connections (max_connections: %d)", soft, cap, wanted)
    return cap


def raise_fd_limit(max_connections: int) -> None:
    """Raise the soft open-file limit toward the hard one so ``max_connections`` fit (workers inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _fds_for(max_connections)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


GC_YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between collections of the youngest generation; CPython's default is
700. A request allocates a few hundred container objects that reference counting frees when it ends:
at 700, collections run every request or two and walk the objects of the requests still in flight;
at 10,000 most of a request's objects are gone before a collection sees them. Under wrk (64 clients,
whole answers, gateway CPU per request, two interleaved rounds): 0.3009/0.3054 ms at 700,
0.2846/0.2869 at 10,000, 0.2887/0.2901 at 50,000, 0.2863/0.2949 at 3,000. Cyclic garbage (a few
exceptions' tracebacks) waits that many allocations longer: kilobytes."""


def tune_gc() -> None:
    """The serving process's collector: its startup objects (modules, config, the app) set apart from
    collections (``gc.freeze``: they live as long as the process), and the young generation collected
    every ``GC_YOUNG_THRESHOLD`` allocations. Process-wide: called by ``serve`` once the app is built,
    never by code that may share a process (tests build many apps in one)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)

"""The ``server:``, ``limits:``, ``admin:`` and ``metrics:`` sections: the gateway's own listener and bounds."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from gateway.strict import Frozen


class ServerConfig(Frozen):
    host: str = "127.0.0.1"
    """Address the gateway listens on; the default takes connections from this machine only
    (``0.0.0.0``: every interface)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of the API (and of ``/admin`` unless ``admin.port`` is set); 0: a free port the system picks."""
    cache_dir: str | None = None
    """Where models derived from GGUF files are kept; default: $XDG_CACHE_HOME/enginegate."""
    # Connection limits (read at start; gateway/http/protocol.py enforces them).
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Request line and headers together; beyond it 431."""
    max_headers: int = Field(default=100, ge=8)
    """Most header lines one request may send; beyond it 431."""
    max_url_bytes: int = Field(default=8192, ge=256)
    """Beyond it 414."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """From a request's first byte to the end of its headers (slowloris); then 408."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Time to receive a request body, extended by one second per ``body_min_rate_bytes_s`` received."""
    body_min_rate_bytes_s: int = Field(default=16 * 1024, ge=1)
    """Bytes per second a slow upload must keep up: each this many bytes received add a second to
    ``body_timeout_s``; a body slower than that gets 408."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle connection (none in flight, new or between requests) is closed after this."""
    max_connections: int = Field(default=1000, ge=1)
    """Open client connections; beyond it new ones get a fast 503 with Retry-After (idle ones are
    closed first to make room; health probes get a few extra connections)."""
    max_output_buffer_bytes: int = Field(default=256 * 1024, ge=4096)
    """What the gateway holds for a client that reads slowly before it stops writing to it."""
    write_timeout_s: float = Field(default=30.0, gt=0)
    """A client that accepts nothing for this long, its output buffer full, is treated as gone."""
    allowed_hosts: list[str] | None = None
    """``Host`` names accepted (port ignored; ``*.example.com`` matches subdomains; ``["*"]``: all).
    Default: on a loopback address only localhost, 127.0.0.1 and [::1] (DNS rebinding), else all."""
    cors_origins: list[str] = []
    """Browser origins allowed by CORS (``["*"]``: any); default none: no CORS headers, preflight refused."""
    drain_delay_s: float = Field(default=0.0, ge=0)
    """On SIGTERM /readyz turns 503 at once; new connections are still served this long (so load
    balancers notice) before the listener closes."""
    shutdown_grace_s: float = Field(default=20.0, gt=0)
    """Then requests in flight get this long; streams still open get an error event and [DONE]."""
    docs: bool = False
    """Interactive API docs at ``/docs`` (Swagger UI served from the ``docs`` extra, never a CDN);
    ``/openapi.json`` is always served."""
    backend_headers: bool = True
    """Answers name the backend that served them (``x-enginegate-backend``) and the routing rule that
    matched (``x-enginegate-rule``), for operators; false keeps the fleet's names from clients (error
    messages never carry them)."""
    trusted_proxies: list[str] = []
    """Addresses or CIDRs of the proxies in front of the gateway: only a request from one of them has
    its ``X-Forwarded-For`` read (the right-most address no trusted proxy holds is the client, for the
    admin lockout and the logs). Default none: the connection's peer is the client."""

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        bad = []
        for cidr in value:
            try:
                ipaddress.ip_network(cidr.strip(), strict=False)  # as gateway.http.peers reads them
            except ValueError:
                bad.append(cidr)
        if bad:
            raise ValueError(f"not an address or CIDR: {', '.join(map(repr, bad))}")
        return value


class LimitsConfig(Frozen):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body in bytes (JSON as sent); beyond it 413, before the body is parsed."""
    max_messages: int = Field(default=1024, ge=1)
    """Most messages (chat, Messages) or input items one request may carry; beyond it 400."""
    max_stop_chars: int = Field(default=1024, ge=1)
    """Longest stop string a request may send (at most 4, as OpenAI allows)."""
    max_tokens: int = Field(default=32768, ge=1)
    """Largest ``max_tokens`` a client may ask for."""
    health_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between two polls of every backend's health and load (never a billed completion)."""


class AdminConfig(Frozen):
    api_key_env: str | None = None
    """Environment variable holding the admin key; without it the /admin endpoints are off."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Serve /admin on this port only (``enginegate serve`` listens there too); the API port answers 404."""
    max_failures: int = Field(default=5, ge=1)
    """Wrong admin keys from one address before it is locked out (429 with Retry-After)."""
    lockout_s: float = Field(default=30.0, gt=0)
    """The first lockout; each failure while locked out doubles it, up to an hour."""
    recent_decisions: int = Field(default=100, ge=0, le=10_000)
    """Routing decisions kept in memory for ``GET /admin/decisions`` and the console (the newest; 0:
    none kept). Kept only while the admin key is set: each holds the request's model, sizes and budgets
    and the ranked candidates with their predictions, never prompt text."""


class MetricsConfig(Frozen):
    api_key_env: str | None = None
    """Environment variable holding the key ``/metrics`` asks for (``Authorization: Bearer <key>``);
    without it the admin key is asked for instead, when ``/metrics`` is protected."""
    protected: bool | None = None
    """Whether ``/metrics`` needs that key; default: when ``metrics.api_key_env`` is set or
    ``auth.required`` is on (the per-team series tell who spends what)."""

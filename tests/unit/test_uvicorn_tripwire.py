"""Every uvicorn member the gateway relies on beyond its public API, named, so an upgrade fails here.

The gateway subclasses uvicorn's httptools protocol (connection limits), its multiprocess supervisor
(signal meanings) and takes over its server's signal handler (drain). pyproject.toml pins uvicorn's
minor version; when the pin moves, this test says which member went away, by name, before the abuse
suite fails in some roundabout way.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
import tomllib
from pathlib import Path

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server, ServerState
from uvicorn.supervisors import Multiprocess

# Methods of HttpToolsProtocol the gateway overrides or calls (gateway/http protocol module).
PROTOCOL_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "handle_websocket_upgrade",
    "_should_upgrade",
    "_unset_keepalive_if_required",
)
# Attributes an HttpToolsProtocol instance has once built or connected, read by the gateway.
PROTOCOL_ATTRIBUTES = ("cycle", "parser", "connections", "loop")
# Set per request by on_message_begin, or on connection by connection_made.
PER_REQUEST_ATTRIBUTES = ("url", "headers", "scope")
PER_CONNECTION_ATTRIBUTES = ("transport", "client")
# Attributes of the request cycle the gateway reads or sets when it refuses a request mid-way, and when
# it sends a whole response in one call, or a stream's head and events (gateway/http/coalesce.py).
CYCLE_ATTRIBUTES = (
    "response_started", "response_complete", "disconnected", "message_event", "keep_alive", "transport",
    "waiting_for_100_continue", "chunked_encoding", "expected_content_length", "flow", "access_log", "scope",
    "default_headers", "on_response",
)  # fmt: skip
# What the request cycle does with its transport: all the gateway's stand-in (gateway/http/coalesce.py) has.
CYCLE_TRANSPORT_CALLS = {"write", "close", "is_closing"}
SUPERVISOR_METHODS = ("__init__", "handle_hup", "handle_int", "terminate_all", "run")
SUPERVISOR_ATTRIBUTES = ("processes", "sockets")


def _app(scope: object, receive: object, send: object) -> None:  # pragma: no cover - never called
    raise AssertionError


def test_the_pin_is_the_version_installed() -> None:
    """pyproject pins uvicorn to one minor version: this test was written against that one."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["dependencies"] if r.startswith("uvicorn")]
    assert len(pins) == 1, "uvicorn is not a dependency"
    major, minor = (int(part) for part in uvicorn.__version__.split(".")[:2])
    assert f">={major}.{minor}" in pins[0] and f"<{major}.{minor + 1}" in pins[0], (pins[0], uvicorn.__version__)


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_protocol_method_exists(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name, None)), f"uvicorn HttpToolsProtocol.{name} is gone"


def test_protocol_module_members() -> None:
    assert isinstance(getattr(httptools_impl, "STATUS_LINE", None), dict), "uvicorn httptools_impl.STATUS_LINE"
    for name in ("HEADER_RE", "HEADER_VALUE_RE"):  # one character class each (send_whole searches joined lines)
        pattern = getattr(httptools_impl, name, None)
        assert isinstance(pattern, re.Pattern), name
        assert pattern.pattern[:1] == b"[" and pattern.pattern[-1:] == b"]", (name, pattern.pattern)
    assert 200 in httptools_impl.STATUS_LINE
    assert hasattr(ServerState(), "connections"), "uvicorn ServerState.connections"
    params = inspect.signature(HttpToolsProtocol.__init__).parameters
    assert list(params)[1:5] == ["config", "server_state", "app_state", "_loop"], list(params)


def test_protocol_instance_attributes() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=_app, http="httptools", log_config=None)
        config.load()
        proto = HttpToolsProtocol(config, ServerState(), {}, loop)
        missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(proto, name)]
        assert not missing, f"uvicorn HttpToolsProtocol instance lacks {missing}"
    finally:
        loop.close()
    for method, names in (("on_message_begin", PER_REQUEST_ATTRIBUTES), ("connection_made", PER_CONNECTION_ATTRIBUTES)):
        source = inspect.getsource(getattr(HttpToolsProtocol, method))
        missing = [name for name in names if f"self.{name} =" not in source]
        assert not missing, f"uvicorn HttpToolsProtocol.{method} no longer sets {missing}"


def test_request_cycle_attributes() -> None:
    params = inspect.signature(httptools_impl.RequestResponseCycle.__init__).parameters
    assert "keep_alive" in params and "message_event" in params, list(params)
    source = inspect.getsource(httptools_impl.RequestResponseCycle.__init__)
    missing = [name for name in CYCLE_ATTRIBUTES if f"self.{name}" not in source]
    assert not missing, f"uvicorn RequestResponseCycle lacks {missing}"


def test_the_request_cycle_uses_only_what_the_one_write_transport_has() -> None:
    source = inspect.getsource(httptools_impl.RequestResponseCycle)
    calls = set(re.findall(r"self\.transport\.(\w+)", source))
    assert calls <= CYCLE_TRANSPORT_CALLS, calls - CYCLE_TRANSPORT_CALLS
    assert 'self.transport.write(b"HTTP/1.1 100 Continue' in source, "the interim response the stand-in never holds"


@pytest.mark.parametrize("name", SUPERVISOR_METHODS)
def test_supervisor_method_exists(name: str) -> None:
    assert callable(getattr(Multiprocess, name, None)), f"uvicorn Multiprocess.{name} is gone"


def test_supervisor_attributes() -> None:
    source = inspect.getsource(Multiprocess.__init__)
    missing = [name for name in SUPERVISOR_ATTRIBUTES if f"self.{name}" not in source]
    assert not missing, f"uvicorn Multiprocess lacks {missing}"


def test_server_signal_handler_is_a_bound_method() -> None:
    """The drain finds the running server through its SIGTERM handler's ``__self__``."""
    assert callable(getattr(Server, "handle_exit", None)), "uvicorn Server.handle_exit is gone"
    server = Server(Config(app=_app, log_config=None))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with server.capture_signals():
            handler = signal.getsignal(signal.SIGTERM)
            assert getattr(handler, "__self__", None) is server, handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    for name in ("should_exit", "force_exit"):
        assert hasattr(server, name), f"uvicorn Server.{name}"

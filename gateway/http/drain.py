"""Graceful drain on SIGTERM, in one process or in each worker of ``serve --workers N``.

SIGTERM: ``/readyz`` answers 503 at once and responses stop keeping connections alive; after
``server.drain_delay_s`` (load balancers notice meanwhile) the listener closes, so new
connections are refused; requests in flight get ``server.shutdown_grace_s``; then the generation
requests still running are cancelled, which stops their engine work and ends each with an error
(streams: an SSE error event and ``[DONE]``). The process exits 0. SIGINT drains without the delay;
a second SIGINT skips the grace.

uvicorn's server does the closing and waiting; this module replaces its signal handler (uvicorn
installs it before it loads the app, so ``attach`` runs from the app factory) and adds the delay
and the ending of requests. uvicorn's own graceful timeout is set a little longer
(``SETTLE_S``) and only cancels what is left after that (no generation request is).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Protocol, runtime_checkable

import uvicorn
from starlette.types import ASGIApp

from gateway.http.protocol import Served

log = logging.getLogger("enginegate.drain")

SETTLE_S = 3.0
"""After the grace, what the ended requests get to send their last words before uvicorn cancels."""


@runtime_checkable
class Drainable(Protocol):
    """The app a drain stops (``gateway.app.Gateway``): the gateway it serves, and the generation
    requests still running."""

    @property
    def state(self) -> Served: ...

    def end_requests(self) -> int: ...


class Drain:
    def __init__(self, server: uvicorn.Server, gateway: Drainable, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.gateway = gateway
        self.loop = loop
        cfg = gateway.state.config.server
        self.delay_s = cfg.drain_delay_s
        self.grace_s = cfg.shutdown_grace_s
        self._stopping = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: only flags here, the rest runs on the loop.
        state = self.gateway.state
        if not state.draining:
            state.draining = True
            self.loop.call_soon_threadsafe(self._begin, sig)
        elif sig == signal.SIGINT:
            if self.server.should_exit:
                self.server.force_exit = True  # as uvicorn does: a second Ctrl-C stops waiting
            self.loop.call_soon_threadsafe(self._stop)

    def _begin(self, sig: int) -> None:
        delay = self.delay_s if sig == signal.SIGTERM else 0.0
        log.info(
            "draining: /readyz answers 503; new connections refused in %.1f s; requests in flight get %.1f s more",
            delay, self.grace_s,
        )  # fmt: skip
        self.loop.call_later(delay, self._stop)

    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.server.should_exit = True  # uvicorn closes the listener on its next tick (0.1 s)
        # Under --workers the listening socket is shared: the supervisor shuts it down when it stops
        # (gateway/http/supervisor.py); a worker restarted on its own must leave it to the others.
        self.loop.call_later(self.grace_s + 0.1, self._end)

    def _end(self) -> None:
        ended = self.gateway.end_requests()
        if ended:
            log.warning("shutdown grace over: ended %d requests still running", ended)


def attach(app: ASGIApp) -> ASGIApp:
    """Take over the running uvicorn server's SIGTERM/SIGINT handling for ``app`` (a ``Gateway``).
    Call it while uvicorn loads the app (from an app factory)."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    if isinstance(server, uvicorn.Server) and isinstance(app, Drainable):
        Drain(server, app, asyncio.get_running_loop()).install()
    else:
        log.warning("no graceful drain: not started by enginegate serve")
    return app

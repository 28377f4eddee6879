"""uvicorn's httptools protocol, stamping when each request's first byte was parsed.

The gateway reports its own overhead (``x-enginegate-overhead-ms``, the overhead histogram) from
that moment, so the HTTP server's own work on the request counts too, not only the app's.
"""

from __future__ import annotations

import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RECEIVED = "enginegate.received"
"""Scope key: ``time.perf_counter()`` when the request's first byte was parsed."""


class StampedHttpToolsProtocol(HttpToolsProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[RECEIVED] = time.perf_counter()  # type: ignore[literal-required]

"""Counter and gauge changes of the request path, added up in a dict and written to prometheus-client
in one pass: at every scrape of this process, and within ``FLUSH_S`` of the first change.

prometheus-client takes a lock and five Python calls per ``inc()``; a request made seven of them
(in flight, its end, its decision, its attempt, its tokens), about 4 us of the gateway's CPU per
whole answer. Added up here, each is one dict update, and a flush writes each label set's sum once.
A scrape of this process flushes first, so what it reports is exact; with several workers
(prometheus-client's multiprocess mode) another worker's changes reach the shared files within
``FLUSH_S``. Histograms are observed at once: prometheus-client has no way to add many observations
in one call.
"""

from __future__ import annotations

import asyncio
from typing import Any

FLUSH_S = 0.1
"""The longest a change waits before it is written (only another worker's scrape can see the wait)."""


class Pending:
    """Changes to metric children (a labelled ``Counter`` or ``Gauge``), by child, until flushed."""

    __slots__ = ("_changes", "_handle")

    def __init__(self) -> None:
        self._changes: dict[Any, float] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, child: Any, amount: float = 1.0) -> None:
        changes = self._changes
        changes[child] = changes.get(child, 0.0) + amount
        if self._handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a script, a synchronous test): written now
                self.flush()
                return
            self._handle = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Write every change held (a gauge whose changes cancel out is left alone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        changes, self._changes = self._changes, {}
        for child, amount in changes.items():
            if amount:
                child.inc(amount)

"""Counter and gauge changes of the request path, added up in a dict and written to prometheus-client
in one pass: at every scrape of this process, and within ``FLUSH_S`` of the first change.

prometheus-client takes a lock and five Python calls per ``inc()``; a request made seven of them
(in flight, its end, its decision, its attempt, its tokens), about 4 us of the gateway's CPU per
whole answer. Added up here, each is one dict update, and a flush writes each label set's sum once.
A scrape of this process flushes first, so what it reports is exact; with several workers
(prometheus-client's multiprocess mode) another worker's changes reach the shared files within
``FLUSH_S``. Histogram observations are held the same way (about 1.5 us each through ``observe``,
a lock per bucket and sum): a flush counts each histogram's held values into its buckets and adds
them, a bucket and the sum once each, through the members ``observe`` itself uses (prometheus-client
has no call that adds many observations); a histogram without them is given each value through
``observe``. ``tests/unit/test_pending.py`` checks the result against ``observe``'s.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Any

FLUSH_S = 0.1
"""The longest a change waits before it is written (only another worker's scrape can see the wait)."""


class Pending:
    """Changes to metric children (a labelled ``Counter`` or ``Gauge``), by child, until flushed."""

    __slots__ = ("_changes", "_handle", "_observed")

    def __init__(self) -> None:
        self._changes: dict[Any, float] = {}
        self._observed: dict[Any, list[float]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, child: Any, amount: float = 1.0) -> None:
        changes = self._changes
        changes[child] = changes.get(child, 0.0) + amount
        if self._handle is None:
            self._arm()

    def observe(self, histogram: Any, amount: float) -> None:
        """``histogram.observe(amount)`` (a labelled ``Histogram``), at the next flush."""
        held = self._observed.get(histogram)
        if held is None:
            self._observed[histogram] = [amount]
        else:
            held.append(amount)
        if self._handle is None:
            self._arm()

    def _arm(self) -> None:
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
        observed, self._observed = self._observed, {}
        for histogram, amounts in observed.items():
            _observe_all(histogram, amounts)


def _observe_all(histogram: Any, amounts: list[float]) -> None:
    """What ``observe`` of each amount does, a bucket and the sum written once each."""
    bounds: list[float] | None = getattr(histogram, "_upper_bounds", None)
    buckets: list[Any] | None = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    counts = [0] * len(bounds)
    for amount in amounts:
        if amount == amount:  # NaN is in no bucket (observe compares it with each bound: never below)
            i = bisect_left(bounds, amount)  # the first bound at or above it: where observe counts it
            if i < len(counts):
                counts[i] += 1
    total.inc(sum(amounts))
    for i, count in enumerate(counts):
        if count:
            buckets[i].inc(count)

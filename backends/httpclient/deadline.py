"""A connection's read deadline, moved by every wait and checked by one timer that stays armed.

A stream waits for the engine once per event. A timer scheduled and cancelled per wait (``call_later``
and ``cancel``: 1.3 µs together on uvloop) cost more than the rest of the wait; here a wait only moves
the deadline. The timer, when it fires, arms again for the deadline if a later wait moved it, and
reports it passed otherwise: the owner then tells whether a wait was still pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EARLY_S = 0.001
"""How much before the deadline its timer may fire (the loop's timers count milliseconds)."""


class Deadline:
    """``start(timeout_s)`` at each wait; ``passed`` is called once the latest one's time is up."""

    __slots__ = ("_at", "_loop", "_passed", "_timer", "due", "head", "timeout_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, passed: Callable[[], None]) -> None:
        self._loop = loop
        self._passed = passed
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the timer is armed for
        self.due = 0.0
        """The latest wait's deadline (``loop.time()``), its length and whether it waits for a head."""
        self.timeout_s = 0.0
        self.head = False

    def start(self, timeout_s: float, head: bool) -> None:
        due = self.due = self._loop.time() + timeout_s
        self.timeout_s, self.head = timeout_s, head
        if self._timer is None or self._at > due:
            self.arm(due)

    def arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = self._loop.call_at(at, self._fire)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._loop.time() < self.due - EARLY_S:
            self.arm(self.due)
            return
        self._passed()

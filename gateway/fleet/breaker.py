"""Per-backend circuit breaker with gradual recovery.

Closed until ``threshold`` consecutive engine failures; then open for a cooldown
that starts short (a restart blip costs about a second, not ten) and doubles each
time a recovery fails, up to ``max_cooldown_s``; then half-open, taking a share
of *requests* (routing draws a random gate per request, so identical prompts are
admitted like any other) that doubles with every success until the breaker
closes. While half-open, one stray failure is forgiven (an engine that answers
most requests is back); a second failure that outnumbers the successes opens it
again. Every transition is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from routing.types import Breaker

log = logging.getLogger("enginegate.breaker")


@dataclass
class CircuitBreaker:
    name: str = ""
    threshold: int = 5
    cooldown_s: float = 1.0
    """Cooldown after the first opening; doubled by every failed recovery, reset when it closes."""
    max_cooldown_s: float = 30.0
    initial_share: float = 0.1
    failures: int = 0
    state: Breaker = Breaker.CLOSED
    share: float = 1.0
    opened_at: float = 0.0
    current_cooldown_s: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def _move(self, state: Breaker, share: float) -> None:
        if state is not self.state:
            log.warning(
                "circuit breaker %s -> %s",
                self.state.value,
                state.value,
                extra={"backend": self.name, "failures": self.failures, "cooldown_s": self.current_cooldown_s},
            )
        self.state, self.share = state, share

    def current(self) -> tuple[Breaker, float]:
        """(state, share of traffic) now; an open breaker past its cooldown turns half-open."""
        if self.state is Breaker.OPEN and self.clock() - self.opened_at >= self.current_cooldown_s:
            self.probe_failures = self.probe_successes = 0
            self._move(Breaker.HALF_OPEN, self.initial_share)
        return self.state, self.share

    def success(self) -> None:
        self.failures = 0
        if self.state is Breaker.HALF_OPEN:
            self.probe_successes += 1
            share = min(1.0, self.share * 2)
            if share >= 1.0:
                self.current_cooldown_s = 0.0
                self._move(Breaker.CLOSED, 1.0)
            else:
                self.share = share

    def failure(self) -> None:
        self.failures += 1
        if self.state is Breaker.HALF_OPEN:
            self.probe_failures += 1
            if self.probe_failures < 2 or self.probe_failures <= self.probe_successes:
                return
            self.current_cooldown_s = min(self.max_cooldown_s, max(self.cooldown_s, self.current_cooldown_s * 2))
        elif self.state is Breaker.CLOSED and self.failures >= self.threshold:
            self.current_cooldown_s = self.cooldown_s
        else:
            return
        self.opened_at = self.clock()
        self._move(Breaker.OPEN, 0.0)

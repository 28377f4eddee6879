"""Per-backend circuit breaker with gradual recovery.

Closed until ``threshold`` consecutive failures; then open for ``cooldown_s``;
then half-open, taking a small share of traffic (routing gates it) that doubles
with every success until the breaker closes; any failure while half-open opens
it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from routing.types import Breaker


@dataclass
class CircuitBreaker:
    threshold: int = 5
    cooldown_s: float = 10.0
    initial_share: float = 0.1
    failures: int = 0
    state: Breaker = Breaker.CLOSED
    share: float = 1.0
    opened_at: float = 0.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def _now(self) -> float:
        return self.clock()

    def current(self) -> tuple[Breaker, float]:
        """(state, share of traffic) now; an open breaker past its cooldown turns half-open."""
        if self.state is Breaker.OPEN and self._now() - self.opened_at >= self.cooldown_s:
            self.state, self.share = Breaker.HALF_OPEN, self.initial_share
        return self.state, self.share

    def success(self) -> None:
        self.failures = 0
        if self.state is Breaker.HALF_OPEN:
            self.share = min(1.0, self.share * 2)
            if self.share >= 1.0:
                self.state = Breaker.CLOSED

    def failure(self) -> None:
        self.failures += 1
        if self.state is Breaker.HALF_OPEN or self.failures >= self.threshold:
            self.state, self.share, self.opened_at = Breaker.OPEN, 0.0, self._now()

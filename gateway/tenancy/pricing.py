"""What a request costs: each model's price per million tokens from config (``models[].price_per_mtok_*``).

Prices are the operator's list prices, not derived from ``cost_per_hour``: a budget in dollars has
to mean the same on every backend, and a cost from measured engine time would charge a client more
when the fleet is slow. Cached prompt tokens (when an engine reports them) cost the cached price
(default: half the input price), so the engine's prefix cache credits the key.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass

from backends.base import Usage
from gateway.tenancy.limiter import NANOS_PER_USD


@dataclass(frozen=True, slots=True)
class Price:
    input: float = 0.0
    """Dollars per million prompt tokens."""
    output: float = 0.0
    cached: float | None = None

    def nanos(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        """Nano-dollars (a dollar per million tokens is 1,000 nano-dollars a token)."""
        cached_tokens = min(max(0, cached_tokens), prompt_tokens)
        cached_price = self.cached if self.cached is not None else self.input / 2
        total = (prompt_tokens - cached_tokens) * self.input + cached_tokens * cached_price
        return round((total + completion_tokens * self.output) * 1000)

    def of(self, usage: Usage) -> int:
        return self.nanos(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens or 0)


FREE = Price()


def usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD


def period_of(kind: str, now: float) -> tuple[str, int, str]:
    """The budget period containing ``now`` (UTC): its name, seconds its counter lives, and its first day."""
    t = time.gmtime(now)
    if kind == "day":
        day = time.strftime("%Y-%m-%d", t)
        return day, 2 * 86400, day
    days = calendar.monthrange(t.tm_year, t.tm_mon)[1]
    return time.strftime("%Y-%m", t), (days + 1) * 86400, time.strftime("%Y-%m-01", t)


def day_of(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def period_left(kind: str, now: float) -> float:
    """Seconds from ``now`` until the budget period containing it ends (UTC midnight, or the month's first)."""
    t = time.gmtime(now)
    if kind == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return start + 86400 - now
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - now

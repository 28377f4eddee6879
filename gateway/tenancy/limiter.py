"""Admission against a key's limits: requests and tokens per sliding window, concurrent requests and spend.

One call admits or refuses a request and, when it admits, records it everywhere at once: a request
in the window, its reserved tokens (prompt plus the most it may generate), a concurrency slot (a
lease, so a replica that dies does not hold it for ever) and its reserved cost against the budget.
``settle`` replaces the reservation with what the request really used and frees the slot. So no
key spends past its limits however many requests race: the reservation is taken before the work.

``LocalLimiter`` holds the counters in this process; ``gateway/tenancy/redis_limiter.py`` holds the
very same ones in Redis, updated by server-side scripts, for every replica sharing it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol

NANOS_PER_USD = 1_000_000_000
"""Spend is counted in integer nano-dollars: exact sums, and a cheap token costs a whole number."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request's claim on its key's limits (0: that limit is off)."""

    key: str
    member: str
    """Unique per request: names its entries so settlement finds them."""
    rpm: int
    tpm: int
    concurrency: int
    tokens: int
    budget_nanos: int
    cost_nanos: int
    period: str
    """The budget period this request is charged to (``2026-12`` or ``2026-12-01``)."""
    period_ttl_s: int
    spent_nanos: int = 0
    """The period's spend as the database knows it: the counter starts there when it is new."""
    window_s: float = 60.0
    lease_s: float = 660.0
    period_left_s: float = 0.0
    """Seconds until the budget period ends (a spent budget's Retry-After)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    refused: str | None = None
    """``requests``, ``tokens``, ``too_large`` (more tokens than the limit: the gateway refuses those
    with a 400 before asking), ``concurrency`` or ``quota``."""
    retry_after_s: float = 0.0
    remaining_requests: int = 0
    remaining_tokens: int = 0
    reset_requests_s: float = 0.0
    reset_tokens_s: float = 0.0
    local: bool = True
    """Counted in this process (no Redis, or Redis unreachable and failing open)."""


class Limiter(Protocol):
    async def admit(self, ask: Ask, now: float) -> Verdict: ...
    async def settle(self, ask: Ask, tokens: int, cost_nanos: int, local: bool = False) -> None:
        """``local``: the request was admitted by the in-process counters (``Verdict.local``)."""

    async def close(self) -> None: ...


_PRUNE_EVERY = 4096
"""Keys counted for the first time between two sweeps of the empty ones."""


class _Counters:
    __slots__ = ("requests", "slots", "tokens", "used", "window")

    def __init__(self) -> None:
        self.window = 60.0
        self.requests: deque[float] = deque()
        self.tokens: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """member -> (admitted at, tokens): in admission order, so expiry pops from the front."""
        self.used = 0
        self.slots: dict[str, float] = {}
        """member -> lease end."""


class LocalLimiter:
    """The counters of one process: the same semantics as Redis's, for one replica (all synchronous, so
    nothing interleaves on the event loop)."""

    def __init__(self) -> None:
        self._keys: dict[str, _Counters] = {}
        self._spend: dict[tuple[str, str], int] = {}
        self._reserved: dict[str, int] = {}
        """member -> cost reserved here and not settled yet (settlement corrects only what was charged here)."""
        self._created = 0

    def _expire(self, c: _Counters, now: float, window: float) -> None:
        edge = now - window
        while c.requests and c.requests[0] <= edge:
            c.requests.popleft()
        while c.tokens:
            member, (at, amount) = next(iter(c.tokens.items()))
            if at > edge:
                break
            del c.tokens[member]
            c.used -= amount
        if c.slots:
            for member in [m for m, end in c.slots.items() if end <= now]:
                del c.slots[member]

    async def admit(self, ask: Ask, now: float) -> Verdict:
        return self.admit_now(ask, now)

    def admit_now(self, ask: Ask, now: float) -> Verdict:
        c = self._counters(ask, now)
        window = ask.window_s
        self._expire(c, now, window)
        spend_key = (ask.key, ask.period)
        spent = self._spend.setdefault(spend_key, ask.spent_nanos)
        count = len(c.requests)

        def verdict(admitted: bool, refused: str | None = None, retry: float = 0.0) -> Verdict:
            taken = 1 if admitted else 0
            newest_req = now if admitted else (c.requests[-1] if c.requests else None)
            newest_tok = now if admitted else (next(reversed(c.tokens.values()))[0] if c.tokens else None)
            return Verdict(
                admitted,
                refused,
                retry,
                max(0, ask.rpm - count - taken) if ask.rpm else 0,
                max(0, ask.tpm - c.used) if ask.tpm else 0,  # admitted: already counted
                max(0.0, newest_req + window - now) if newest_req is not None else 0.0,
                max(0.0, newest_tok + window - now) if newest_tok is not None else 0.0,
            )

        if ask.budget_nanos and spent + ask.cost_nanos > ask.budget_nanos:
            return verdict(False, "quota")
        if ask.rpm and count >= ask.rpm:
            return verdict(False, "requests", c.requests[count - ask.rpm] + window - now)
        if ask.tpm and ask.tokens > ask.tpm:
            return verdict(False, "too_large", window)
        if ask.tpm and c.used + ask.tokens > ask.tpm:
            need = c.used + ask.tokens - ask.tpm
            retry = window
            for at, amount in c.tokens.values():
                need -= amount
                if need <= 0:
                    retry = at + window - now
                    break
            return verdict(False, "tokens", retry)
        if ask.concurrency and len(c.slots) >= ask.concurrency:
            return verdict(False, "concurrency", 1.0)
        c.requests.append(now)
        c.tokens[ask.member] = (now, ask.tokens)
        c.used += ask.tokens
        if ask.concurrency:
            c.slots[ask.member] = now + ask.lease_s
        self._spend[spend_key] = spent + ask.cost_nanos
        self._reserved[ask.member] = ask.cost_nanos
        return verdict(True)

    def record(self, ask: Ask, now: float) -> None:
        """Count a request admitted elsewhere (by Redis) in this process's windows, unchecked: when Redis
        is unreachable these counters go on from what this replica really admitted, and when it is back
        they are what this replica writes into it (``RedisLimiter``)."""
        c = self._counters(ask, now)
        self._expire(c, now, ask.window_s)
        c.requests.append(now)
        c.tokens[ask.member] = (now, ask.tokens)
        c.used += ask.tokens
        if ask.concurrency:
            c.slots[ask.member] = now + ask.lease_s

    def _counters(self, ask: Ask, now: float) -> _Counters:
        c = self._keys.get(ask.key)
        if c is None:
            self._created += 1
            if self._created % _PRUNE_EVERY == 0:
                self._prune(now)
            c = self._keys[ask.key] = _Counters()
        c.window = ask.window_s
        return c

    def entries(self, key: str) -> list[tuple[str, float, int, float, float]]:
        """This process's requests of ``key`` in its window (as last expired): (member, admitted at,
        tokens, lease end or 0 once it ended, the window)."""
        c = self._keys.get(key)
        if c is None:
            return []
        return [(m, at, n, c.slots.get(m, 0.0), c.window) for m, (at, n) in c.tokens.items()]

    def key_ids(self) -> list[str]:
        return list(self._keys)

    def _prune(self, now: float) -> None:
        """Forget the keys with nothing left in their windows (every key a replica ever saw would stay otherwise)."""
        for key, c in list(self._keys.items()):
            self._expire(c, now, c.window)
            if not c.requests and not c.tokens and not c.slots:
                del self._keys[key]

    def forget_spend(self) -> None:
        """Spend counted here starts again from the database's record (Redis counts it meanwhile)."""
        self._spend.clear()

    async def settle(self, ask: Ask, tokens: int, cost_nanos: int, local: bool = True) -> None:
        self.settle_now(ask, tokens, cost_nanos)

    def settle_now(self, ask: Ask, tokens: int, cost_nanos: int) -> None:
        c = self._keys.get(ask.key)
        if c is not None:
            c.slots.pop(ask.member, None)
            entry = c.tokens.get(ask.member)
            if entry is not None:  # still in the window: the reservation becomes the real count
                c.tokens[ask.member] = (entry[0], tokens)
                c.used += tokens - entry[1]
        reserved = self._reserved.pop(ask.member, None)
        spend_key = (ask.key, ask.period)
        if reserved is not None and spend_key in self._spend:
            self._spend[spend_key] += cost_nanos - reserved

    def spent(self, key: str, period: str) -> int | None:
        return self._spend.get((key, period))

    async def close(self) -> None:
        return None

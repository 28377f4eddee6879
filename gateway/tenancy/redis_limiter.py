"""The limiter's counters in Redis, shared by every replica: one script call admits or refuses a request
(one round trip, atomic on the server), another settles it (``gateway/tenancy/redis_scripts.py``).

Per key ``K`` (hash-tagged): ``eg:{K}:req`` (a sorted set of admitted requests by time), ``eg:{K}:tok``
with ``eg:{K}:tokn`` and ``eg:{K}:tsum`` (each request's tokens by time, and their sum),
``eg:{K}:conc`` (concurrency leases by their end), ``eg:{K}:spend:<period>`` (nano-dollars) and
``eg:{K}:res:<period>`` (the reservations not settled yet). Timestamps are the replicas' clocks in
milliseconds: keep them in sync (NTP); a skew of a few milliseconds only shifts the window's edge.

Every request admitted through Redis is also counted in this process (``LocalLimiter.record``). When
Redis cannot be reached the fail modes decide, per request: a key with a budget follows
``budget_fail_open`` (default closed: ``LimiterDown``, the gateway answers 503, so no replica spends
what another might have), the rate limits follow ``fail_open`` (open: this process's counters, which
already hold what it admitted in the window, decide alone). Settlements that cannot reach Redis and
requests admitted alone are kept; every ``retry_s`` a background task tries Redis again and, before
Redis decides again, writes all of them back (``PUSH``, ``SETTLE``: idempotent, so a write that
timed out but landed is not counted twice), along with this process's requests still in the window
(which also refills the windows of a Redis that restarted empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.tenancy.limiter import Ask, LocalLimiter, Verdict
from gateway.tenancy.redis_scripts import ADMIT, PUSH, SETTLE

log = logging.getLogger("enginegate.tenancy")

_CONNECTIONS = 32
_ROUNDS = 8
"""Write-back rounds in a row (then ``retry_s`` before the next try)."""


class LimiterDown(Exception):
    """Redis cannot be reached and the fail mode for this request is ``closed``; ``budget``: because of
    the key's budget."""

    def __init__(self, budget: bool) -> None:
        super().__init__("budget" if budget else "rate")
        self.budget = budget


@dataclass(slots=True)
class _Pending:
    """A request Redis does not know all of yet."""

    ask: Ask
    alone: bool
    """Admitted by this process while Redis was away (else only its settlement is missing)."""
    settled: tuple[int, int] | None = None
    """(tokens, cost) once it ended."""


def _keys(ask: Ask) -> list[str]:
    return _names(ask.key, ask.period)


def _names(key: str, period: str) -> list[str]:
    base = f"eg:{{{key}}}"
    return [f"{base}:req", f"{base}:tok", f"{base}:tokn", f"{base}:tsum", f"{base}:conc",
            f"{base}:spend:{period}", f"{base}:res:{period}"]  # fmt: skip


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class RedisLimiter:
    def __init__(
        self,
        url: str,
        fail_open: bool,
        timeout_s: float,
        retry_s: float,
        on_fallback: Callable[[str], None] = lambda _: None,
        budget_fail_open: bool = False,
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # A bounded pool that makes a burst wait its turn for a connection (briefly: that wait counts
        # as Redis being unreachable too) instead of opening one connection per request.
        # No retries: a failed call goes to the fail mode at once instead of adding backoff to the request.
        # RESP2: under RESP3, redis-py 7+ turns on its maintenance notifications and then skips the
        # check that replaces a pooled connection the server closed, so after Redis restarts every
        # connection in the pool would fail its next call (and trip the fail mode once more each).
        once = Retry(NoBackoff(), 0)
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=_CONNECTIONS, timeout=timeout_s * 20, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=once, protocol=2,
        )  # fmt: skip
        self._redis: Any = aioredis.Redis(connection_pool=pool, retry=once)
        self._admit = self._redis.register_script(ADMIT)
        self._settle = self._redis.register_script(SETTLE)
        self._push = self._redis.register_script(PUSH)
        self.fail_open = fail_open
        self.budget_fail_open = budget_fail_open
        self.retry_s = retry_s
        self.local = LocalLimiter()
        """This process's requests (all of them: through Redis or alone) and the fallback's counters."""
        self._pending: dict[str, _Pending] = {}
        self._recovery: asyncio.Task[None] | None = None
        self._writing: asyncio.Event | None = None
        """Set while a write-back is under way: admissions wait for it (then Redis, or the fallback)."""
        self._on_fallback = on_fallback

    @property
    def down(self) -> bool:
        return self._recovery is not None

    def _failed(self, exc: BaseException, what: str) -> None:
        if self._recovery is None:
            log.warning("redis unreachable (%s: %s); budgets %s, rate limits %s", what, type(exc).__name__,
                        "on this process's counters" if self.budget_fail_open else "refused",
                        "on this process's counters" if self.fail_open else "refused")  # fmt: skip
            self._recovery = asyncio.get_running_loop().create_task(self._recover())
        self._on_fallback(what)

    def _fallback(self, ask: Ask, now: float) -> Verdict:
        if ask.budget_nanos and not self.budget_fail_open:
            raise LimiterDown(budget=True)
        if not self.fail_open:
            raise LimiterDown(budget=False)
        verdict = self.local.admit_now(ask, now)
        if verdict.admitted:
            self._pending[ask.member] = _Pending(ask, alone=True)
        return verdict

    async def admit(self, ask: Ask, now: float) -> Verdict:
        if self._writing is not None:  # Redis is back and being told what it missed: a moment, not a fallback
            await self._writing.wait()
        if self.down:  # until everything counted alone is written back, Redis's counts are not the whole story
            self._on_fallback("admit")
            return self._fallback(ask, now)
        args: list[str | int] = [
            _ms(now), _ms(ask.window_s), ask.rpm, ask.tpm, ask.concurrency, ask.member, ask.tokens,
            _ms(ask.lease_s), ask.budget_nanos, ask.cost_nanos, ask.period_ttl_s, ask.spent_nanos,
        ]  # fmt: skip
        try:
            r = await self._admit(keys=_keys(ask), args=args)
        except _unreachable() as exc:
            _still_cancelled()
            self._failed(exc, "admit")
            return self._fallback(ask, now)
        _still_cancelled()  # redis-py may also finish the command it swallowed the cancellation in
        refused = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        verdict = Verdict(
            admitted=int(r[0]) == 1,
            refused=refused or None,
            retry_after_s=float(r[2]) / 1000,
            remaining_requests=int(r[3]),
            remaining_tokens=int(r[4]),
            reset_requests_s=float(r[5]) / 1000,
            reset_tokens_s=float(r[6]) / 1000,
            local=False,
        )
        if verdict.admitted:
            self.local.record(ask, now)
        return verdict

    async def settle(self, ask: Ask, tokens: int, cost_nanos: int, local: bool = False) -> None:
        self.local.settle_now(ask, tokens, cost_nanos)
        pending = self._pending.get(ask.member)
        if pending is not None:  # written back with its real use
            pending.settled = (tokens, cost_nanos)
            return
        if self.down:
            self._pending[ask.member] = _Pending(ask, alone=False, settled=(tokens, cost_nanos))
            return
        try:
            await self._settle(keys=_keys(ask), args=[ask.member, tokens, cost_nanos])
        except _unreachable() as exc:
            _still_cancelled()
            # Kept and written back with the rest; meanwhile the reservation stands (never less than the real use).
            self._pending[ask.member] = _Pending(ask, alone=False, settled=(tokens, cost_nanos))
            self._failed(exc, "settle")

    async def _recover(self) -> None:
        while True:
            await asyncio.sleep(self.retry_s)
            writing = self._writing = asyncio.Event()
            try:
                # New admissions wait; settlements of requests under way still come in: write those
                # too until a round ends with nothing new (each round is shorter than the last).
                await self.write_back()
                for _ in range(_ROUNDS):
                    if not self._pending:
                        break
                    await self.write_back(window=False)
            except _unreachable():
                self._on_fallback("write_back")
            else:
                if not self._pending:  # nothing new came in during the last awaits: Redis decides again
                    self._recovery = None
                    self.local.forget_spend()  # the next outage starts from the database's record again
                    log.warning("redis reachable again; this process's counts written back")
            finally:
                self._writing = None
                writing.set()
            if self._recovery is None:
                return

    async def write_back(self, window: bool = True) -> None:
        """Write the requests this process admitted alone and the settlements Redis missed into Redis,
        and (``window``) this process's requests still in the window (each call idempotent: a repeat
        counts nothing twice)."""
        now = _ms(time.time())
        writes: list[tuple[list[str], list[str | int]]] = [
            (_names(key, ""), [now, _ms(span), member, _ms(at), tokens, _ms(lease_end), 0, 0, 0, 0, 1])
            for key in (self.local.key_ids() if window else ())
            for member, at, tokens, lease_end, span in self.local.entries(key)
            if not self._is_alone(member)  # those are written with their spend below
        ]
        for i in range(0, len(writes), _CONNECTIONS):
            await asyncio.gather(*(self._push(keys=k, args=a) for k, a in writes[i : i + _CONNECTIONS]))
        pending = list(self._pending.items())
        for i in range(0, len(pending), _CONNECTIONS):
            await asyncio.gather(*(self._write(member, p) for member, p in pending[i : i + _CONNECTIONS]))

    async def _write(self, member: str, pending: _Pending) -> None:
        settled = pending.settled
        if pending.alone:
            await self._alone(pending)
        else:
            assert settled is not None
            await self._settle(keys=_keys(pending.ask), args=[member, settled[0], settled[1]])
        if self._pending.get(member) is pending and pending.settled is settled:  # unchanged meanwhile
            del self._pending[member]

    def _is_alone(self, member: str) -> bool:
        pending = self._pending.get(member)
        return pending is not None and pending.alone

    async def _alone(self, pending: _Pending) -> None:
        ask, settled = pending.ask, pending.settled
        tokens, cost = settled if settled is not None else (ask.tokens, ask.cost_nanos)
        entry = next((e for e in self.local.entries(ask.key) if e[0] == ask.member), None)
        at, lease_end = (entry[1], entry[3]) if entry is not None else (0.0, 0.0)
        args: list[str | int] = [
            _ms(time.time()), _ms(ask.window_s), ask.member, _ms(at), tokens, _ms(lease_end), 1, cost,
            1 if settled is None else 0, ask.spent_nanos, ask.period_ttl_s,
        ]  # fmt: skip
        await self._push(keys=_keys(ask), args=args)

    async def close(self) -> None:
        """Stop. What this process counted alone or settled while Redis was away, and Redis has not got
        yet, is written back once more if Redis answers now (the write-back is idempotent): a replica
        stopped during or just after an outage, as a rolling restart does, would take it away."""
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recovery
            self._recovery = None
            if self._pending:
                try:
                    await self.write_back()
                except _unreachable():
                    log.warning("redis unreachable at shutdown: %d requests counted here are not in it",
                                len(self._pending))  # fmt: skip
        await self._redis.aclose()


def _unreachable() -> tuple[type[Exception], ...]:
    """What a Redis call raises when Redis cannot be reached or answer. Evaluated by an ``except`` only
    when something was raised, so redis (an optional extra) is imported then, not on every call."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


def _still_cancelled() -> None:
    """redis-py turns a cancellation that lands mid-command into a connection error: a task being
    cancelled (its client left, the gateway shuts down) stops here rather than carrying on with a
    fallback (which swallowed the cancellation: a client that left kept its request running)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

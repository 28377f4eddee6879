"""One suite over both limiters (in process, and Redis's scripts against a real redis-server): the same
semantics, exact under concurrency."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.tenancy.limiter import Ask, Limiter, LocalLimiter
from gateway.tenancy.redis_limiter import LimiterDown, RedisLimiter
from tests.tenancy.services import RedisServer

_ids = itertools.count()


def ask(key: str, **kw: Any) -> Ask:
    fields: dict[str, Any] = dict(
        key=key, member=f"r{next(_ids)}", rpm=0, tpm=0, concurrency=0, tokens=10, budget_nanos=0, cost_nanos=0,
        period="2026-12", period_ttl_s=3600, window_s=60.0, lease_s=600.0,
    )  # fmt: skip
    fields.update(kw)
    return Ask(**fields)


Make = Callable[[], Limiter]


@pytest.fixture(params=["local", "redis"])
def make(request: pytest.FixtureRequest) -> Make:
    """Builds the limiter inside the test's event loop (Redis connections belong to one loop)."""
    if request.param == "local":
        return LocalLimiter
    server: RedisServer = request.getfixturevalue("redis_server")
    return lambda: RedisLimiter(server.url, fail_open=False, timeout_s=2.0, retry_s=1.0)


def run(make: Make, body: Callable[[Limiter], Awaitable[None]]) -> None:
    async def go() -> None:
        limiter = make()
        try:
            await body(limiter)
        finally:
            await limiter.close()

    asyncio.run(go())


def key() -> str:
    return f"{next(_ids):08x}"


def test_requests_per_window_are_exact_and_retry_names_the_oldest(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        k = key()
        verdicts = [await limiter.admit(ask(k, rpm=3), 1000.0 + i) for i in range(5)]
        assert [v.admitted for v in verdicts] == [True, True, True, False, False]
        assert verdicts[3].refused == "requests"
        assert verdicts[3].retry_after_s == pytest.approx(57.0)  # the first leaves the window at 1060
        assert [v.remaining_requests for v in verdicts[:3]] == [2, 1, 0]
        assert (await limiter.admit(ask(k, rpm=3), 1060.5)).admitted  # the oldest expired: room for one

    run(make, body)


def test_tokens_are_reserved_then_settled_with_the_real_use(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        k = key()
        first = ask(k, tpm=100, tokens=60)
        assert (await limiter.admit(first, 1000.0)).admitted
        second = await limiter.admit(ask(k, tpm=100, tokens=60), 1001.0)
        assert (second.admitted, second.refused) == (False, "tokens")
        assert second.retry_after_s == pytest.approx(59.0)
        await limiter.settle(first, 20, 0, isinstance(limiter, LocalLimiter))  # used 20 of the 60 reserved
        third = await limiter.admit(ask(k, tpm=100, tokens=60), 1002.0)
        assert third.admitted and third.remaining_tokens == 20

    run(make, body)


def test_a_request_larger_than_the_limit_is_refused_as_too_large(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        verdict = await limiter.admit(ask(key(), tpm=100, tokens=101), 1000.0)
        assert (verdict.admitted, verdict.refused) == (False, "too_large")

    run(make, body)


def test_concurrency_slots_free_on_settlement_and_when_the_lease_ends(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        k = key()
        local = isinstance(limiter, LocalLimiter)
        a = ask(k, concurrency=2, lease_s=30.0)
        assert (await limiter.admit(a, 1000.0)).admitted
        assert (await limiter.admit(ask(k, concurrency=2, lease_s=30.0), 1000.0)).admitted
        refused = await limiter.admit(ask(k, concurrency=2, lease_s=30.0), 1000.0)
        assert refused.refused == "concurrency"
        await limiter.settle(a, 10, 0, local)
        assert (await limiter.admit(ask(k, concurrency=2, lease_s=30.0), 1001.0)).admitted
        # Two slots held, the third refused, until the leases of a replica that died would end.
        assert not (await limiter.admit(ask(k, concurrency=2, lease_s=30.0), 1001.0)).admitted
        assert (await limiter.admit(ask(k, concurrency=2, lease_s=30.0), 1031.5)).admitted

    run(make, body)


def test_budget_reserves_the_most_a_request_can_cost_and_settles_the_real_cost(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        k = key()
        local = isinstance(limiter, LocalLimiter)
        a = ask(k, budget_nanos=1000, cost_nanos=600)
        assert (await limiter.admit(a, 1000.0)).admitted
        quota = await limiter.admit(ask(k, budget_nanos=1000, cost_nanos=600), 1000.0)
        assert (quota.admitted, quota.refused) == (False, "quota")
        await limiter.settle(a, 10, 100, local)  # it cost 100, not 600
        assert (await limiter.admit(ask(k, budget_nanos=1000, cost_nanos=600), 1000.0)).admitted
        assert not (await limiter.admit(ask(k, budget_nanos=1000, cost_nanos=600), 1000.0)).admitted
        # Another period starts from what the database says was spent in it.
        fresh = ask(k, budget_nanos=1000, cost_nanos=600, period="2027-01", spent_nanos=500)
        assert (await limiter.admit(fresh, 1000.0)).refused == "quota"

    run(make, body)


def test_many_concurrent_admissions_admit_exactly_the_limit(make: Make) -> None:
    async def body(limiter: Limiter) -> None:
        k = key()
        verdicts = await asyncio.gather(
            *(limiter.admit(ask(k, rpm=37, tpm=10_000, tokens=50), 1000.0) for _ in range(300))
        )
        assert sum(v.admitted for v in verdicts) == 37
        k2 = key()
        verdicts = await asyncio.gather(*(limiter.admit(ask(k2, tpm=1000, tokens=30), 1000.0) for _ in range(300)))
        assert sum(v.admitted for v in verdicts) == 33  # 33 x 30 = 990 <= 1000 < 34 x 30

    run(make, body)


def test_two_clients_of_one_redis_share_the_counters(redis_server: RedisServer) -> None:
    """Two replicas: separate connections, one set of counters."""

    async def body() -> None:
        a = RedisLimiter(redis_server.url, fail_open=False, timeout_s=2.0, retry_s=1.0)
        b = RedisLimiter(redis_server.url, fail_open=False, timeout_s=2.0, retry_s=1.0)
        k = key()
        try:
            verdicts = await asyncio.gather(*(lim.admit(ask(k, rpm=25), 1000.0) for lim in (a, b) * 100))
        finally:
            await a.close()
            await b.close()
        assert sum(v.admitted for v in verdicts) == 25

    asyncio.run(body())


def test_redis_down_fails_open_on_local_counters_or_closed(fresh_redis: RedisServer) -> None:
    async def body() -> None:
        opened = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=0.5, retry_s=60.0)
        closed = RedisLimiter(fresh_redis.url, fail_open=False, timeout_s=0.5, retry_s=60.0)
        k = key()
        try:
            assert not (await opened.admit(ask(k, rpm=2), 1000.0)).local
            fresh_redis.stop()
            verdicts = [await opened.admit(ask(k, rpm=2), 1000.0) for _ in range(3)]
            # The fallback counts on its own: two more in this process, then refused.
            assert [(v.admitted, v.local) for v in verdicts] == [(True, True), (True, True), (False, True)]
            with pytest.raises(LimiterDown):
                await closed.admit(ask(k, rpm=2), 1000.0)
        finally:
            await opened.close()
            await closed.close()

    asyncio.run(body())


def test_after_redis_restarts_every_pooled_connection_reconnects(fresh_redis: RedisServer) -> None:
    """Connections pooled before a restart are replaced, not failed: the limiter is back on Redis at
    once, not falling back (or refusing, failing closed) once per stale connection."""

    async def body() -> None:
        limiter = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=1.0, retry_s=0.1)
        try:
            k = key()
            verdicts = await asyncio.gather(*(limiter.admit(ask(k, rpm=1000), 1000.0) for _ in range(20)))
            assert not any(v.local for v in verdicts)  # twenty connections in the pool
            fresh_redis.stop()
            fresh_redis.start()
            await asyncio.sleep(0)  # one turn of the loop: it reads the closed sockets, as a serving one does
            verdicts = await asyncio.gather(*(limiter.admit(ask(k, rpm=1000), 1000.0) for _ in range(20)))
            assert [v.local for v in verdicts] == [False] * 20
        finally:
            await limiter.close()

    asyncio.run(body())

"""One suite over both limiters (in process, and Redis's scripts against a real redis-server): the same
semantics, exact under concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
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


def test_redis_down_fails_open_for_rates_on_what_this_replica_counted_and_closed_for_budgets(
    fresh_redis: RedisServer,
) -> None:
    async def body() -> None:
        opened = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=0.5, retry_s=60.0)
        closed = RedisLimiter(fresh_redis.url, fail_open=False, timeout_s=0.5, retry_s=60.0)
        k = key()
        try:
            assert not (await opened.admit(ask(k, rpm=2), 1000.0)).local
            fresh_redis.stop()
            verdicts = [await opened.admit(ask(k, rpm=2), 1000.0) for _ in range(2)]
            # This process's counters hold the request Redis admitted: one more, then refused.
            assert [(v.admitted, v.local) for v in verdicts] == [(True, True), (False, True)]
            with pytest.raises(LimiterDown) as down:  # a budget is never spent on one replica's word
                await opened.admit(ask(key(), budget_nanos=1000, cost_nanos=10), 1000.0)
            assert down.value.budget
            with pytest.raises(LimiterDown) as down:
                await closed.admit(ask(k, rpm=2), 1000.0)
            assert not down.value.budget
        finally:
            await opened.close()
            await closed.close()

    asyncio.run(body())


def test_what_a_replica_counted_while_redis_was_away_is_written_back_once(durable_redis: RedisServer) -> None:
    """Redis stopped and started (its data kept): requests admitted alone, their spend (budgets failing
    open here) and a settlement Redis missed all reach it when it is back, and writing them again
    changes nothing."""

    async def body() -> None:
        now = time.time()
        a = RedisLimiter(durable_redis.url, fail_open=True, timeout_s=0.5, retry_s=0.1, budget_fail_open=True)
        b = RedisLimiter(durable_redis.url, fail_open=True, timeout_s=0.5, retry_s=0.1)
        k = key()
        spend = f"eg:{{{k}}}:spend:2026-12"
        try:
            first = ask(k, rpm=4, tokens=50, budget_nanos=10_000, cost_nanos=300)
            assert (await a.admit(first, now)).admitted  # through Redis
            durable_redis.stop()
            await a.settle(first, 20, 100)  # Redis misses it: kept
            alone = [ask(k, rpm=4, tokens=50, budget_nanos=10_000, cost_nanos=300) for _ in range(4)]
            verdicts = [await a.admit(x, now) for x in alone]
            assert [v.admitted for v in verdicts] == [True, True, True, False]  # 4 in this process's window
            await a.settle(alone[0], 30, 200)  # ended while Redis was away; the other two are still running
            durable_redis.start()
            await poll(lambda: not a.down)
            assert durable_redis.call("ZCARD", f"eg:{{{k}}}:req") == "4"
            assert durable_redis.call("GET", f"eg:{{{k}}}:tsum") == str(20 + 30 + 50 + 50)
            assert durable_redis.call("GET", spend) == str(100 + 200 + 300 + 300)
            assert not (await b.admit(ask(k, rpm=4), now)).admitted  # the other replica sees all four
            await a.write_back()  # again: nothing counted twice
            assert durable_redis.call("GET", spend) == str(100 + 200 + 300 + 300)
            await a.settle(alone[1], 10, 50)  # settled through Redis now, once
            await a.settle(alone[1], 10, 50)
            assert durable_redis.call("GET", spend) == str(100 + 200 + 50 + 300)
            assert durable_redis.call("GET", f"eg:{{{k}}}:tsum") == str(20 + 30 + 10 + 50)
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_what_a_replica_counted_alone_reaches_redis_when_it_stops_first(durable_redis: RedisServer) -> None:
    """A replica stopped after Redis came back but before its next write-back try (a rolling restart
    after an outage): stopping writes back what it counted alone, so the other replicas see it."""

    async def body() -> None:
        now = time.time()
        a = RedisLimiter(durable_redis.url, fail_open=True, timeout_s=0.5, retry_s=60.0)
        k = key()
        durable_redis.stop()
        try:
            alone = [ask(k, rpm=5) for _ in range(3)]
            assert all([(await a.admit(x, now)).admitted for x in alone])
            await a.settle(alone[0], 4, 0)
            assert a.down
        finally:
            durable_redis.start()
            await a.close()
        assert durable_redis.call("ZCARD", f"eg:{{{k}}}:req") == "3"
        assert durable_redis.call("GET", f"eg:{{{k}}}:tsum") == str(4 + 10 + 10)
        b = RedisLimiter(durable_redis.url, fail_open=True, timeout_s=0.5, retry_s=60.0)
        try:
            assert [(await b.admit(ask(k, rpm=5), now)).admitted for _ in range(3)] == [True, True, False]
        finally:
            await b.close()

    asyncio.run(body())


def test_a_redis_that_restarted_empty_gets_the_windows_back(fresh_redis: RedisServer) -> None:
    async def body() -> None:
        now = time.time()
        a = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=0.5, retry_s=0.1)
        k = key()
        try:
            assert all([(await a.admit(ask(k, rpm=3), now)).admitted for _ in range(2)])
            fresh_redis.stop()
            fresh_redis.start()  # empty
            assert (await a.admit(ask(k, rpm=3), now)).admitted  # the failed call: counted here, alone
            await poll(lambda: not a.down)
            assert fresh_redis.call("ZCARD", f"eg:{{{k}}}:req") == "3"
            assert not (await a.admit(ask(k, rpm=3), now)).admitted
        finally:
            await a.close()

    asyncio.run(body())


def test_the_write_back_ends_under_steady_traffic_and_misses_nothing(fresh_redis: RedisServer) -> None:
    """Requests arriving while a replica writes back wait for it instead of adding to what it must write."""

    async def body() -> None:
        a = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=0.5, retry_s=0.1)
        k = key()
        admitted = 0

        running = True

        async def client() -> None:
            nonlocal admitted
            while running:  # stopped, not cancelled: an admission cancelled mid-call is the caller's to lose
                verdict = await a.admit(ask(k, rpm=1_000_000, concurrency=1000), time.time())
                admitted += verdict.admitted  # after the await: tasks would overwrite each other's counts
                await asyncio.sleep(0.001)

        try:
            fresh_redis.stop()
            clients = [asyncio.create_task(client()) for _ in range(4)]
            await poll(lambda: a.down and admitted > 50)
            fresh_redis.start()
            await poll(lambda: not a.down)
            running = False
            await asyncio.gather(*clients)
            assert fresh_redis.call("ZCARD", f"eg:{{{k}}}:req") == str(admitted)
        finally:
            await a.close()

    asyncio.run(asyncio.wait_for(body(), 30))


async def poll(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not done in time"
        await asyncio.sleep(0.05)


def test_keys_with_nothing_left_in_their_windows_are_forgotten() -> None:
    limiter = LocalLimiter()
    for _ in range(4094):
        assert limiter.admit_now(ask(key(), rpm=1), 1000.0).admitted
    busy = key()
    limiter.record(ask(busy, concurrency=1, lease_s=600.0), 1000.0)  # still running at 1100
    assert len(limiter.key_ids()) == 4095
    limiter.admit_now(ask(key(), rpm=1), 1100.0)  # the 4096th key: a sweep first
    assert sorted(limiter.key_ids())[0] == busy and len(limiter.key_ids()) == 2


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


def test_a_request_cancelled_while_redis_answers_stops_there(fresh_redis: RedisServer) -> None:
    """redis-py swallows a cancellation that lands mid-command (it finishes the command, or turns it into
    a connection error): the admission must still end cancelled, not carry the request on."""

    async def body() -> None:
        a = RedisLimiter(fresh_redis.url, fail_open=True, timeout_s=0.5, retry_s=0.1)
        entered = asyncio.Event()

        async def swallowing(**_: object) -> list[object]:
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):  # as redis-py does
                await asyncio.sleep(10)
            return [1, b"", 0, 1, 1, 0, 0]

        a._admit = swallowing  # type: ignore[assignment]
        try:
            task = asyncio.create_task(a.admit(ask(key(), rpm=5), time.time()))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await a.close()

    asyncio.run(asyncio.wait_for(body(), 10))

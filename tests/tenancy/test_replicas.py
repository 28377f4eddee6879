"""Two ``enginegate serve`` replicas sharing a real redis-server and a real PostgreSQL: limits, tokens,
concurrency and budgets hold exactly across both under many concurrent clients (the fake engine's
own count shows what got through), a revoked key stops on both within ``auth.cache_s``, and what
happens when Redis dies (fail open on each replica's own counters, or fail closed with 503)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.abuse.probes import Engine
from tests.conftest import GatewayProcess
from tests.polling import wait_until
from tests.tenancy.gateways import config_text, keys_cli
from tests.tenancy.services import Postgres, RedisServer

HI: Any = [{"role": "user", "content": "hi"}]
CACHE_S = 0.5


@pytest.fixture(scope="module")
def config(
    tmp_path_factory: pytest.TempPathFactory, engine: Engine, postgres: Postgres, redis_server: RedisServer
) -> Path:
    path = tmp_path_factory.mktemp("replicas") / "gateway.yaml"
    auth = f"required: true, database: '{postgres.dsn}', cache_s: {CACHE_S}, usage_flush_s: 0.2"
    path.write_text(config_text(engine, auth, f"url: '{redis_server.url}', on_error: closed, timeout_s: 5"))
    return path


@pytest.fixture(scope="module")
def replicas(config: Path, cache_dir: Path) -> Iterator[list[GatewayProcess]]:
    gws = [GatewayProcess(config, cache_dir), GatewayProcess(config, cache_dir)]
    yield gws
    for gw in gws:
        gw.stop()


async def _burst(replicas: list[GatewayProcess], key: str, n: int, **kw: Any) -> list[int | str]:
    """``n`` requests at once, alternating between the replicas: each one's status (or 429's code)."""
    clients = [
        openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0, timeout=60) for gw in replicas
    ]

    async def one(i: int) -> int | str:
        try:
            await clients[i % len(clients)].chat.completions.create(
                model=kw.get("model", "fast"), messages=HI, **{k: v for k, v in kw.items() if k != "model"}
            )
        except openai.APIStatusError as exc:  # 429s by their code (rate_limit_exceeded, insufficient_quota)
            return str(exc.code)
        return 200

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for c in clients:
            await c.close()


def burst(replicas: list[GatewayProcess], key: str, n: int, **kw: Any) -> list[int | str]:
    return asyncio.run(_burst(replicas, key, n, **kw))


def test_requests_per_minute_are_exact_across_two_replicas(
    replicas: list[GatewayProcess], config: Path, engine: Engine
) -> None:
    key = keys_cli(config, "create", "--rpm", "23")["key"]
    before = engine.stats()["started"]
    results = burst(replicas, key, 120, max_tokens=2)
    assert results.count(200) == 23
    assert results.count("rate_limit_exceeded") == 97
    assert engine.stats()["started"] - before == 23  # the engine's own count: nothing leaked past


def test_tokens_are_reserved_at_admission_so_concurrent_requests_cannot_overspend(
    replicas: list[GatewayProcess], config: Path, engine: Engine
) -> None:
    key = keys_cli(config, "create", "--tpm", "500")["key"]
    probe = openai.OpenAI(base_url=f"{replicas[0].base_url}/v1", api_key=key, max_retries=0)
    raw = probe.chat.completions.with_raw_response.create(model="slow", messages=HI, max_tokens=60)
    reservation = 500 - int(raw.headers["x-ratelimit-remaining-tokens"])
    used = raw.parse().usage
    assert used is not None
    # Slow answers (60 tokens, one every 40 ms): the whole burst is decided while the admitted run, and
    # each settles 2 tokens below its reservation, far too little to let another in.
    results = burst(replicas, key, 60, model="slow", max_tokens=60)
    admitted = results.count(200)
    # The first request settled at its real use (8 + 20); the burst's reservations fill the rest, and not one more.
    room = 500 - used.total_tokens
    assert admitted == room // reservation
    # Each settled with what the engine counted (8 + 60), not its reservation: the window holds the
    # real use. (Probes reserve 11 and use 9 each.)
    probes = 0

    def settled() -> bool:
        nonlocal probes
        raw = probe.chat.completions.with_raw_response.create(model="fast", messages=HI, max_tokens=1)
        probes += 1
        real = (admitted + 1) * used.total_tokens + (probes - 1) * 9
        return int(raw.headers["x-ratelimit-remaining-tokens"]) == 500 - real - (reservation - 59)

    wait_until(settled, timeout=5, message="the reservations were not settled with the real use")


def test_concurrent_requests_are_capped_across_replicas(replicas: list[GatewayProcess], config: Path) -> None:
    key = keys_cli(config, "create", "--concurrency", "3")["key"]
    results = burst(replicas, key, 30, model="slow", max_tokens=100)  # each runs four seconds
    assert results.count(200) == 3
    # Slots come back when requests end.
    assert burst(replicas, key, 1, model="fast", max_tokens=2) == [200]


def test_spend_never_exceeds_the_budget_across_replicas(replicas: list[GatewayProcess], config: Path) -> None:
    made = keys_cli(config, "create", "--budget-usd", "0.5", "--budget-period", "day")
    # $1000/M in, $2000/M out. Without a tokenizer the prompt "hi" is reserved as 10 tokens (twice the
    # estimate, plus the chat template's 8), so each request reserves $0.03 and costs $0.028 (the
    # engine's 8 prompt tokens and 10 completion tokens): 16 reservations fit the budget, and one more
    # when enough of the first have settled at their real cost before the burst's last admissions.
    results = burst(replicas, made["key"], 60, max_tokens=10)
    admitted = results.count(200)
    assert 16 <= admitted <= 17 and results.count("insufficient_quota") == 60 - admitted

    def spent() -> Any:
        doc = keys_cli(config, "usage", made["id"])
        return doc if doc["total"]["requests"] == admitted else None

    doc = wait_until(spent, timeout=10, message="usage did not reach the database")
    assert doc["total"]["cost_usd"] == pytest.approx(admitted * 0.028)
    assert doc["total"]["cost_usd"] <= 0.5


def test_a_revoked_key_stops_on_both_replicas_within_the_cache_time(
    replicas: list[GatewayProcess], config: Path
) -> None:
    made = keys_cli(config, "create")
    clients = [openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=made["key"], max_retries=0) for gw in replicas]
    for c in clients:
        c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
    keys_cli(config, "revoke", made["id"])
    revoked_at = time.monotonic()

    def refused(c: openai.OpenAI) -> bool:
        try:
            c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
        except openai.AuthenticationError:
            return True
        return False

    for c in clients:
        wait_until(functools.partial(refused, c), timeout=10, interval=0.05, message="a revoked key kept working")
    assert time.monotonic() - revoked_at <= CACHE_S + 2.0  # the cache time, plus a request on a busy machine


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_redis_dying_fails_open_or_closed_as_configured(
    mode: str, tmp_path: Path, engine: Engine, fresh_redis: RedisServer, cache_dir: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        config_text(engine, "required: true", f"url: '{fresh_redis.url}', on_error: {mode}, retry_s: 0.2")
    )
    made = keys_cli(config, "create", "--rpm", "5")
    key, window = made["key"], f"eg:{{{made['id']}}}:req"
    gw = GatewayProcess(config, cache_dir)
    try:
        c = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0)
        c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
        fresh_redis.stop()
        if mode == "open":
            # This replica's own counters take over, holding the request Redis admitted: four more.
            answers = [burst([gw], key, 1, max_tokens=2)[0] for _ in range(7)]
            assert answers == [200] * 4 + ["rate_limit_exceeded"] * 3
        else:
            with pytest.raises(openai.InternalServerError) as err:
                c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
            assert err.value.status_code == 503 and err.value.code == "rate_limiter_unavailable"
        # Back, and empty (this one keeps nothing on disk): the replica writes what it counted back
        # (retry_s) before Redis decides again, so the window is the same as before the outage.
        fresh_redis.start()
        counted = "5" if mode == "open" else "1"
        wait_until(lambda: fresh_redis.call("ZCARD", window) == counted, timeout=10, interval=0.1)
        if mode == "open":
            assert burst([gw], key, 3, max_tokens=2) == ["rate_limit_exceeded"] * 3
        else:
            wait_until(lambda: burst([gw], key, 1, max_tokens=2) == [200], timeout=10, interval=0.1)
            assert burst([gw], key, 5, max_tokens=2).count(200) == 3
    finally:
        gw.stop()


def test_without_redis_each_replica_counts_alone(tmp_path: Path, engine: Engine, cache_dir: Path) -> None:
    """Why Redis: two replicas sharing only the key database each admit the whole limit (what the
    exact tests above would see if the counters were not shared)."""
    config = tmp_path / "gateway.yaml"
    config.write_text(config_text(engine, "required: true"))  # SQLite beside the file, shared by both
    key = keys_cli(config, "create", "--rpm", "10")["key"]
    gws = [GatewayProcess(config, cache_dir), GatewayProcess(config, cache_dir)]
    try:
        assert burst(gws, key, 60, max_tokens=2).count(200) == 20
    finally:
        for gw in gws:
            gw.stop()


async def _answers(replicas: list[GatewayProcess], key: str, n: int) -> list[tuple[int, str | None, str | None]]:
    """``n`` requests at once, alternating between the replicas: (status, error code, Retry-After)."""
    clients = [
        openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0, timeout=60) for gw in replicas
    ]

    async def one(i: int) -> tuple[int, str | None, str | None]:
        try:
            await clients[i % len(clients)].chat.completions.create(model="fast", messages=HI, max_tokens=10)
        except openai.APIStatusError as exc:
            return exc.status_code, str(exc.code), exc.response.headers.get("retry-after")
        return 200, None, None

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for c in clients:
            await c.close()


def answers(replicas: list[GatewayProcess], key: str, n: int) -> list[tuple[int, str | None, str | None]]:
    return asyncio.run(_answers(replicas, key, n))


def test_a_redis_outage_mid_traffic_never_overspends_and_every_request_is_counted_once(
    tmp_path: Path, engine: Engine, postgres: Postgres, durable_redis: RedisServer, cache_dir: Path
) -> None:
    """Two replicas, Redis stopped and started mid-traffic (defaults: rate limits fail open, budgets
    closed): the budget is never overspent (503 while Redis is away), the rpm key gets what each
    replica may admit alone (its limit, counting what it admitted through Redis) and not one more
    after Redis returns, Redis's counters then hold every admitted request and every dollar once, and
    every refusal says when to retry."""
    config = tmp_path / "gateway.yaml"
    auth = f"required: true, database: '{postgres.dsn}', cache_s: 0.5, usage_flush_s: 0.2"
    config.write_text(config_text(engine, auth, f"url: '{durable_redis.url}', timeout_s: 1, retry_s: 0.2"))
    budget = keys_cli(config, "create", "--budget-usd", "0.2", "--budget-period", "day")
    rpm = keys_cli(config, "create", "--rpm", "20")
    gws = [GatewayProcess(config, cache_dir), GatewayProcess(config, cache_dir)]
    seen: list[tuple[int, str | None, str | None]] = []
    try:
        # Each request reserves $0.03 and costs $0.028 (see the budget test above).
        before = answers(gws, budget["key"], 4) + answers(gws, rpm["key"], 8)
        durable_redis.stop()
        during_budget = answers(gws, budget["key"], 6)
        during_rpm = answers(gws, rpm["key"], 60)
        durable_redis.start()
        probes: list[tuple[int, str | None, str | None]] = []
        for gw in gws:  # each replica back on Redis once it wrote back what it counted alone

            def back(gw: GatewayProcess = gw) -> bool:
                probes.extend(answers([gw], budget["key"], 1))
                return probes[-1][0] != 503

            wait_until(back, timeout=15, interval=0.1)
        after_rpm = answers(gws, rpm["key"], 10)
        after_budget = probes + answers(gws, budget["key"], 20)
        seen = before + during_budget + during_rpm + after_rpm + after_budget
    finally:
        for gw in gws:
            gw.stop()  # usage flushed at shutdown
    assert [s for s, _, _ in during_budget] == [503] * 6
    assert {c for _, c, _ in during_budget} == {"budget_store_unavailable"}
    # Each replica admitted alone up to 20 in the window, counting the 4 of the 8 it admitted through Redis.
    rpm_admitted = [s for s, _, _ in before[4:] + during_rpm + after_rpm].count(200)
    assert rpm_admitted == 40
    assert [s for s, _, _ in after_rpm] == [429] * 10  # Redis holds all 40: not one more
    assert durable_redis.call("ZCARD", f"eg:{{{rpm['id']}}}:req") == "40"
    # Every refusal says when to retry.
    assert all(r is not None and int(r) >= 1 for s, _, r in seen if s in (429, 503))
    assert {c for s, c, _ in after_budget if s != 200} <= {"insufficient_quota", "budget_store_unavailable"}
    # The budget: spend counted by the database (what the engine answered, at list prices) and by Redis.
    paid = [s for s, _, _ in seen if s == 200]
    spent = [s for s, _, _ in before[:4] + after_budget].count(200)
    assert len(paid) == spent + rpm_admitted
    doc = wait_until(lambda: (d := keys_cli(config, "usage", budget["id"]))["total"]["requests"] == spent and d)
    assert doc["total"]["cost_usd"] == pytest.approx(spent * 0.028) and doc["total"]["cost_usd"] <= 0.2
    assert spent == 7  # 4 before; after: 0.112 + 3 x 0.03 <= 0.2 only as each one before settled at 0.028
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert durable_redis.call("GET", f"eg:{{{budget['id']}}}:spend:{day}") == str(spent * 28_000_000)

"""Two ``enginegate serve`` replicas sharing a real redis-server and a real PostgreSQL: limits, tokens,
concurrency and budgets hold exactly across both under many concurrent clients (the fake engine's
own count shows what got through), a revoked key stops on both within ``auth.cache_s``, and what
happens when Redis dies (fail open on each replica's own counters, or fail closed with 503)."""

from __future__ import annotations

import asyncio
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
def engine() -> Iterator[Engine]:
    eng = Engine()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def config(
    tmp_path_factory: pytest.TempPathFactory, engine: Engine, postgres: Postgres, redis_server: RedisServer
) -> Path:
    path = tmp_path_factory.mktemp("replicas") / "gateway.yaml"
    auth = f"required: true, database: '{postgres.dsn}', cache_s: {CACHE_S}, usage_flush_s: 0.2"
    path.write_text(config_text(engine, auth, f"url: '{redis_server.url}', on_error: closed"))
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
        except openai.RateLimitError as exc:
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
    raw = probe.chat.completions.with_raw_response.create(model="slow", messages=HI, max_tokens=20)
    reservation = 500 - int(raw.headers["x-ratelimit-remaining-tokens"])
    used = raw.parse().usage
    assert used is not None
    # Slow answers (a token every 40 ms): every request of the burst is admitted while others still run.
    results = burst(replicas, key, 60, model="slow", max_tokens=20)
    admitted = results.count(200)
    # The first request settled at its real use (8 + 20); the burst's reservations fill the rest, and not one more.
    room = 500 - used.total_tokens
    assert admitted == room // reservation
    assert (admitted + 1) * used.total_tokens + 0 <= 500 + reservation


def test_concurrent_requests_are_capped_across_replicas(replicas: list[GatewayProcess], config: Path) -> None:
    key = keys_cli(config, "create", "--concurrency", "3")["key"]
    results = burst(replicas, key, 30, model="slow", max_tokens=25)  # each runs a second
    assert results.count(200) == 3
    # Slots come back when requests end.
    assert burst(replicas, key, 1, model="fast", max_tokens=2) == [200]


def test_spend_never_exceeds_the_budget_across_replicas(replicas: list[GatewayProcess], config: Path) -> None:
    made = keys_cli(config, "create", "--budget-usd", "0.5", "--budget-period", "day")
    # $1000/M in, $2000/M out: each request reserves its prompt and 10 tokens (about $0.022) and costs
    # $0.028 for the engine's 8 prompt tokens, so the budget admits about 17.
    results = burst(replicas, made["key"], 60, max_tokens=10)
    admitted = results.count(200)
    assert admitted > 0 and results.count("insufficient_quota") == 60 - admitted

    def spent() -> Any:
        doc = keys_cli(config, "usage", made["id"])
        return doc if doc["total"]["requests"] == admitted else None

    doc = wait_until(spent, timeout=10, message="usage did not reach the database")
    assert doc["total"]["cost_usd"] <= 0.5
    assert doc["total"]["cost_usd"] > 0.5 - 0.03  # refused only when the next one could overspend


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
        wait_until(lambda c=c: refused(c), timeout=10, interval=0.05, message="a revoked key kept working")
    assert time.monotonic() - revoked_at <= CACHE_S + 0.5


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_redis_dying_fails_open_or_closed_as_configured(
    mode: str, tmp_path: Path, engine: Engine, fresh_redis: RedisServer, cache_dir: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        config_text(engine, "required: true", f"url: '{fresh_redis.url}', on_error: {mode}, retry_s: 0.2")
    )
    key = keys_cli(config, "create", "--rpm", "5")["key"]
    gw = GatewayProcess(config, cache_dir)
    try:
        c = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0)
        c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
        fresh_redis.stop()
        if mode == "open":
            # Each replica's own counters take over: the key's limit still holds in this process.
            answers = [burst([gw], key, 1, max_tokens=2)[0] for _ in range(7)]
            assert answers == [200] * 5 + ["rate_limit_exceeded"] * 2
        else:
            with pytest.raises(openai.InternalServerError) as err:
                c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
            assert err.value.status_code == 503 and err.value.code == "rate_limiter_unavailable"
        fresh_redis.start()  # back: Redis's counters again (this key's one request is still in its window)
        wait_until(lambda: burst([gw], key, 4, max_tokens=2).count(200) == 4, timeout=10, interval=0.3)
        assert burst([gw], key, 1, max_tokens=2) == ["rate_limit_exceeded"]
    finally:
        gw.stop()

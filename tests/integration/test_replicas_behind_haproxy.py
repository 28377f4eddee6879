"""Three ``enginegate serve`` replicas behind a real HAProxy act as one gateway.

One real redis-server (limits, spend, prefix homes), one real PostgreSQL (keys, usage), the fake
engine of tests/abuse (its own count of the streams it started shows what got through) and Debian's
HAProxy, round robin with health checks on ``/readyz``. Traffic from many concurrent clients goes
through HAProxy while the test revokes keys, kills a replica with SIGKILL, restarts them one at a
time with SIGTERM, and stops and starts Redis. Each test prints what it measured (``-s`` shows it;
docs/replicas.md "Measured" keeps the figures).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from routing.prefix import chain, rendered
from tests.abuse.probes import Engine
from tests.conftest import GatewayProcess
from tests.integration.balancer import HAProxy, Traffic, burst
from tests.polling import wait_until
from tests.tenancy.gateways import keys_cli
from tests.tenancy.services import PG_BIN, Postgres, RedisServer

pytestmark = pytest.mark.skipif(
    not (shutil.which("haproxy") and shutil.which("redis-server") and (PG_BIN / "initdb").exists()),
    reason="needs Debian's haproxy, redis-server and postgresql (make services)",
)

REPLICAS = 3
CACHE_S = 1.0
DRAIN_DELAY_S = 2.0
"""Eight of HAProxy's health-check intervals: it has marked a draining replica down long before its
listener closes."""
CLEAN_AFTER_KILL = {"502", "closed", "cut"}
"""How a request in flight on a replica killed with SIGKILL may end, each an error the client sees
as one: HAProxy's 502, or its closing the client's connection without an answer (what it does on a
kept-alive connection, which HTTP clients treat as retryable), when the replica died before its
answer's headers; a body that breaks off (the client's HTTP library reports an incomplete chunked
body) when it died inside a stream. No one is left to write the gateway's SSE error event; what
must never happen is a stream that ends as if complete (``short``), or any failure of a request
that started after HAProxy marked the replica down."""


def config_text(engine: Engine, redis: RedisServer, postgres: Postgres) -> str:
    # fast/slow: priced (a thousandth of a dollar per input token, two per output token); chat: three
    # backends x, y, z on the same engine for the prefix homes, the opening turn pinned to x by a rule.
    backends = [("fast-engine", "fast", "tok8-0"), ("slow-engine", "slow", "tok8-40")]
    backends += [(name, "chat", "tok8-0") for name in ("x", "y", "z")]
    lines = [
        f"server: {{drain_delay_s: {DRAIN_DELAY_S}, shutdown_grace_s: 20}}",
        "limits: {health_interval_s: 1.0}",
        f"auth: {{required: true, database: '{postgres.dsn}', cache_s: {CACHE_S}, usage_flush_s: 0.2}}",
        f"redis: {{url: '{redis.url}', on_error: open, retry_s: 0.5}}",
        "routing:",
        "  prefix: {share: true}",
        "  rules: [{name: opening, match: {headers: {x-tenant: opening}}, require: [x]}]",
        "models:",
        "  - {name: fast, params_b: 1, context: 4096, price_per_mtok_in: 1000, price_per_mtok_out: 2000}",
        "  - {name: slow, params_b: 1, context: 4096, price_per_mtok_in: 1000, price_per_mtok_out: 2000}",
        "  - {name: chat, params_b: 1, context: 65536}",
        "backends:",
    ]
    lines += [f"  - {{name: {n}, engine: vllm, url: '{engine.url}', model: {m}, served_model: {s}, gpu: H100}}"
              for n, m, s in backends]  # fmt: skip
    return "\n".join([*lines, ""])


def own_config(config: Path, i: int) -> Path:
    """The same config under each replica's own name, so each writes its own log beside it."""
    path = config.with_name(f"replica-{i}.yaml")
    path.write_text(config.read_text())
    return path


@dataclass
class Fleet:
    config: Path
    cache_dir: Path
    engine: Engine
    redis: RedisServer
    replicas: list[GatewayProcess]
    haproxy: HAProxy

    def restart(self, i: int) -> None:
        """Replica ``i`` again on its port (it must have exited), and back in HAProxy's rotation."""
        self.replicas[i] = GatewayProcess(own_config(self.config, i), self.cache_dir, port=self.replicas[i].port)
        name = self.haproxy.names[i]
        wait_until(lambda: name in self.haproxy.up(), timeout=30, interval=0.05, message=f"{name} not back in HAProxy")

    def heal(self) -> None:
        """Every replica running and in rotation (after a test that failed halfway)."""
        for i, gw in enumerate(self.replicas):
            if not gw.alive():
                self.restart(i)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("haproxy-fleet")
    redis, postgres, engine = RedisServer(work), Postgres(), Engine()
    config = work / "gateway.yaml"
    config.write_text(config_text(engine, redis, postgres))
    replicas: list[GatewayProcess] = []
    try:
        replicas += [GatewayProcess(own_config(config, i), cache_dir) for i in range(REPLICAS)]
        haproxy = HAProxy(work, [gw.port for gw in replicas])
        yield Fleet(config, cache_dir, engine, redis, replicas, haproxy)
        haproxy.stop()
    finally:
        for gw in replicas:
            gw.stop()
        engine.stop()
        redis.stop()
        postgres.stop()


@pytest.fixture(autouse=True)
def whole(fleet: Fleet) -> Fleet:
    fleet.heal()
    return fleet


def metric(gw: GatewayProcess, name: str, labels: str = "") -> float:
    text = httpx.get(f"{gw.base_url}/metrics", timeout=10).text
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def usage(fleet: Fleet, key_id: str, requests: int) -> Any:
    """The key's usage in the database once ``requests`` rows have been flushed (None before)."""
    doc = keys_cli(fleet.config, "usage", key_id)
    return doc if doc["total"]["requests"] >= requests else None


def test_limits_and_budgets_are_exact_across_three_replicas(fleet: Fleet) -> None:
    url = fleet.haproxy.url
    key = keys_cli(fleet.config, "create", "--rpm", "23")["key"]
    before = fleet.engine.stats()["started"]
    results = burst(url, key, 120)
    assert (results.count(200), results.count("rate_limit_exceeded")) == (23, 97)
    assert fleet.engine.stats()["started"] - before == 23

    # Tokens: "hi" is reserved as 10 prompt tokens plus max_tokens 10 and uses 8 + 10. The burst may
    # never overspend; topped up one request at a time, the window fills to within one reservation.
    made = keys_cli(fleet.config, "create", "--tpm", "500")
    admitted = burst(url, made["key"], 60, max_tokens=10).count(200)
    while burst(url, made["key"], 1, max_tokens=10) == [200]:
        admitted += 1
    assert 500 - 20 < admitted * 18 <= 500, admitted

    # Budget: each request reserves $0.03 and costs $0.028: 17 fit in $0.50, whatever the order.
    made = keys_cli(fleet.config, "create", "--budget-usd", "0.5", "--budget-period", "day")
    results = burst(url, made["key"], 60, max_tokens=10)
    admitted = results.count(200)
    assert results.count("insufficient_quota") == 60 - admitted
    while burst(url, made["key"], 1, max_tokens=10) == [200]:
        admitted += 1
    assert admitted == 17
    doc = wait_until(partial(usage, fleet, made["id"], admitted), timeout=20, interval=0.2)
    assert doc["total"]["requests"] == 17 and doc["total"]["cost_usd"] == pytest.approx(17 * 0.028)


def test_a_revoked_key_is_refused_by_every_replica_within_the_cache_time(fleet: Fleet) -> None:
    made = keys_cli(fleet.config, "create")
    assert burst(fleet.haproxy.url, made["key"], REPLICAS * 2) == [200] * (REPLICAS * 2)  # cached everywhere
    keys_cli(fleet.config, "revoke", made["id"])
    revoked_at = time.monotonic()

    def refused(gw: GatewayProcess) -> bool:
        return burst(gw.base_url, made["key"], 1) == ["invalid_api_key"]

    took = []
    for gw in fleet.replicas:
        wait_until(partial(refused, gw), timeout=15, interval=0.05, message="a revoked key kept working")
        took.append(time.monotonic() - revoked_at)
    print(f"\nrevoked key refused by all {REPLICAS} replicas after {max(took):.2f} s (cache_s {CACHE_S})")
    assert max(took) <= CACHE_S + 2.0  # the cache time, plus a request on a busy machine


SYSTEM = "You are the help desk of Acme Corporation: answer in one sentence and name the manual section. " * 4
CONVERSATIONS = 8
TURNS = 4


def heard_everything(replicas: list[GatewayProcess]) -> bool:
    """Every replica has applied every prompt the others published (cumulative counters)."""
    sent = [metric(gw, "enginegate_prefix_share_prompts_total", '{direction="sent"}') for gw in replicas]
    received = [metric(gw, "enginegate_prefix_share_prompts_total", '{direction="received"}') for gw in replicas]
    return all(r == sum(sent) - s for s, r in zip(sent, received, strict=True))


def prefix_reuse(url: str, key: str, tag: str, replicas: list[GatewayProcess]) -> float:
    """Conversations in lockstep (each turn of all of them at once, then the next once every replica
    has heard where the last went, as users take seconds between turns and the news milliseconds):
    the share of prompt blocks an engine with an unbounded prefix cache would have found cached on
    the backend each turn went to (``x-enginegate-backend``)."""
    cached: dict[str, set[int]] = {}
    hits = total = 0
    talks = [
        [{"role": "system", "content": f"{tag}: {SYSTEM}"},
         {"role": "user", "content": f"Conversation {n}: my badge reader number {n * 7919} is broken. " * 6}]
        for n in range(CONVERSATIONS)
    ]  # fmt: skip

    async def turn(client: openai.AsyncOpenAI, messages: list[Any], opening: bool) -> str:
        headers = {"x-ttft-budget-ms": "5000", **({"x-tenant": "opening"} if opening else {})}
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=messages, max_tokens=4, extra_headers=headers
        )
        messages += [{"role": "assistant", "content": raw.parse().choices[0].message.content}]
        return raw.headers["x-enginegate-backend"]

    async def round_of(number: int) -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60) as client:
            return list(await asyncio.gather(*(turn(client, m, number == 0) for m in talks)))

    for number in range(TURNS):
        prompts = [chain(rendered([m["content"] for m in talk])) for talk in talks]
        for blocks, backend in zip(prompts, asyncio.run(round_of(number)), strict=True):
            held = cached.setdefault(backend, set())
            found = next((i for i, b in enumerate(blocks) if b not in held), len(blocks))
            hits, total = hits + found, total + len(blocks)
            held.update(blocks)
        for talk in talks:
            talk.append({"role": "user", "content": f"And what about part {number}? " * 8})
        wait_until(partial(heard_everything, replicas), timeout=15, interval=0.1, message="prefix news lost")
    return hits / total


def test_prefix_reuse_through_three_replicas_matches_one_gateway(fleet: Fleet) -> None:
    key = keys_cli(fleet.config, "create")["key"]
    one = prefix_reuse(fleet.replicas[0].base_url, key, "one", fleet.replicas)
    three = prefix_reuse(fleet.haproxy.url, key, "three", fleet.replicas)
    print(f"\nprefix blocks reused: one gateway {one:.3f}, three replicas behind HAProxy {three:.3f}")
    assert one > 0.5  # the workload has history to reuse, so the comparison says something
    assert three >= 0.9 * one


def out_of_rotation(fleet: Fleet, name: str) -> bool:
    return name not in fleet.haproxy.up()


def traffic_key(fleet: Fleet) -> str:
    """A key with limits far above the traffic: every request takes the limiter's path through Redis."""
    return str(keys_cli(fleet.config, "create", "--rpm", "1000000")["key"])


def test_a_replica_killed_mid_traffic_fails_only_its_requests_in_flight(fleet: Fleet) -> None:
    victim, name = fleet.replicas[1], fleet.haproxy.names[1]
    with Traffic(fleet.haproxy.url, traffic_key(fleet)) as traffic:
        wait_until(lambda: len(traffic.outcomes) >= 3 * traffic.workers, timeout=30)
        killed_at = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        wait_until(partial(out_of_rotation, fleet, name), timeout=10, interval=0.02, message="never marked down")
        down_at = time.monotonic()
        wait_until(lambda: traffic.completed_since(down_at) >= 3 * traffic.workers, timeout=60)
    failures = traffic.failures()
    in_flight = [o for o in traffic.outcomes if o.started < killed_at < o.ended]
    print(
        f"\nSIGKILL: {len(traffic.outcomes)} requests, {len(in_flight)} in flight at the kill,"
        f" failed {len(failures)} ({', '.join(sorted({o.kind for o in failures}))}),"
        f" HAProxy marked it down after {down_at - killed_at:.2f} s"
    )
    assert failures, "the kill hit no request in flight: the test shows nothing"
    assert {o.kind for o in failures} <= CLEAN_AFTER_KILL, failures
    assert all(o.started < down_at and o.ended > killed_at for o in failures), failures
    assert all(o.server in ("", name) for o in failures), failures
    assert len(failures) <= len(in_flight)
    assert all(o.kind == "ok" for o in traffic.outcomes if o.started > down_at)
    fleet.restart(1)


def test_a_rolling_restart_under_traffic_fails_no_request(fleet: Fleet) -> None:
    started = time.monotonic()
    with Traffic(fleet.haproxy.url, traffic_key(fleet)) as traffic:
        for i, name in enumerate(fleet.haproxy.names):
            old = fleet.replicas[i]
            old.proc.send_signal(signal.SIGTERM)
            wait_until(partial(out_of_rotation, fleet, name), timeout=10, interval=0.02, message="never drained")
            assert old.proc.wait(timeout=60) == 0
            fleet.restart(i)
        restarted_at = time.monotonic()
        wait_until(lambda: traffic.completed_since(restarted_at) >= traffic.workers, timeout=30)
    served = {o.server for o in traffic.outcomes if o.started > restarted_at}
    print(
        f"\nrolling restart: {len(traffic.outcomes)} requests over {restarted_at - started:.1f} s,"
        f" failed {len(traffic.failures())}"
    )
    assert traffic.failures() == []
    assert served == set(fleet.haproxy.names)


def back_on_redis(gw: GatewayProcess, key: str) -> bool:
    """A request to this replica went through Redis, not its own counters."""
    before = metric(gw, "enginegate_ratelimit_fallbacks_total", '{op="admit"}')
    assert burst(gw.base_url, key, 1) == [200]
    return metric(gw, "enginegate_ratelimit_fallbacks_total", '{op="admit"}') == before


def test_redis_stopped_and_started_mid_traffic_behaves_as_documented(fleet: Fleet) -> None:
    url, rpm = fleet.haproxy.url, 5
    budget = keys_cli(fleet.config, "create", "--budget-usd", "10", "--budget-period", "day")
    budget_answers = burst(url, budget["key"], 3, max_tokens=10)
    with Traffic(fleet.haproxy.url, traffic_key(fleet)) as traffic:
        fleet.redis.stop()
        # on_error: open: each replica admits on its own counters, so a key's limit holds per replica:
        # three times the limit across three (round robin gives each at least its share of the burst).
        assert burst(url, keys_cli(fleet.config, "create", "--rpm", str(rpm))["key"], 60).count(200) == 3 * rpm
        # Budgets fail closed (redis.budget_on_error: closed, the default): no replica spends alone.
        assert burst(url, budget["key"], 3, max_tokens=10) == ["budget_store_unavailable"] * 3
        fleet.redis.start()
        probe = traffic_key(fleet)
        for gw in fleet.replicas:
            wait_until(partial(back_on_redis, gw, probe), timeout=15, interval=0.1, message="not back on Redis")
        back_at = time.monotonic()
        wait_until(lambda: traffic.completed_since(back_at) >= traffic.workers, timeout=30)
    print(f"\nRedis stopped and started: {len(traffic.outcomes)} requests, failed {len(traffic.failures())}")
    assert traffic.failures() == []  # availability first: nothing refused while Redis was away
    # Back: one window across the three again (a fresh key; this Redis keeps nothing on disk).
    assert burst(url, keys_cli(fleet.config, "create", "--rpm", str(rpm))["key"], 60).count(200) == rpm
    # Nothing double-charged: the database holds each answered request once, at its real cost.
    budget_answers += burst(url, budget["key"], 3, max_tokens=10)
    answered = budget_answers.count(200)
    assert answered >= 6  # before and after the outage
    doc = wait_until(partial(usage, fleet, budget["id"], answered), timeout=20, interval=0.2)
    assert doc["total"]["requests"] == answered
    assert doc["total"]["cost_usd"] == pytest.approx(answered * 0.028)

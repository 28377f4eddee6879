"""Fairness within a priority class: on a saturated backend, a key past its share of the work in flight
waits its turn while another key's requests go first; with room, nobody is refused."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.tenancy.fairness import FairShare
from tests.abuse.probes import Engine
from tests.conftest import GatewayProcess
from tests.polling import wait_until
from tests.tenancy.gateways import config_text, keys_cli

HI: Any = [{"role": "user", "content": "hi"}]
ADMIN_KEY = "admin-key-for-scrapes"
SCRAPE = {"authorization": f"Bearer {ADMIN_KEY}"}


def test_a_key_is_over_its_share_only_with_others_active_in_its_class() -> None:
    fair = FairShare()
    fair.start(0, "a", 300)
    assert not fair.over(0, "a")  # alone in its class: all of it is its share
    fair.start(0, "b", 100)
    fair.start(5, "c", 1000)  # another class does not count
    assert fair.over(0, "a") and not fair.over(0, "b")
    fair.end(0, "a", 200)
    assert not fair.over(0, "a")
    fair.end(0, "b", 100)
    fair.end(0, "a", 100)
    assert not fair.over(0, "a")


def in_flight(gw: GatewayProcess) -> float:
    text = httpx.get(f"{gw.base_url}/metrics", headers=SCRAPE, timeout=5).text
    found = re.search(r'^enginegate_requests_in_flight\{route="chat"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_flooding_key_cannot_starve_another_on_a_saturated_backend(
    tmp_path: Path, engine: Engine, cache_dir: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(config_text(engine, "required: true", slots=2, admin="api_key_env: EG_TEST_ADMIN"))
    flood = keys_cli(config, "create", "--name", "flood")["key"]
    polite = keys_cli(config, "create", "--name", "polite")["key"]
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": ADMIN_KEY})  # /metrics needs it: keys are required

    async def run() -> tuple[list[Any], Any, Any]:
        a = openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=flood, max_retries=0, timeout=60)
        b = openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=polite, max_retries=0, timeout=60)

        async def ask(c: openai.AsyncOpenAI, tokens: int) -> Any:
            try:
                return await c.chat.completions.create(model="slow", messages=HI, max_tokens=tokens)
            except openai.RateLimitError as exc:
                return exc

        # The flood fills the backend's two slots and queues behind them: alone, it is never refused.
        flooding = [asyncio.create_task(ask(a, 100)) for _ in range(6)]  # four seconds each
        await asyncio.sleep(0)
        started = engine.stats()["started"]
        await asyncio.to_thread(wait_until, lambda: engine.stats()["started"] >= started + 2, 10)
        polite_answer = asyncio.create_task(ask(b, 2))
        # Once the polite request is in flight (queued), the flood is over its share.
        await asyncio.to_thread(wait_until, lambda: in_flight(gw) == 7, 10)
        over = await ask(a, 50)
        results = await asyncio.gather(*flooding)
        answer = await polite_answer
        await a.close()
        await b.close()
        return results, over, answer

    try:
        results, over, answer = asyncio.run(run())
    finally:
        gw.stop()
    assert not any(isinstance(r, Exception) for r in results)
    assert isinstance(over, openai.RateLimitError) and "fair share" in over.message
    assert not isinstance(answer, Exception)


def test_rules_match_a_keys_team_in_a_real_gateway(tmp_path: Path, engine: Engine, cache_dir: Path) -> None:
    config = tmp_path / "gateway.yaml"
    rules = "[{name: red-team, match: {teams: [red]}}, {name: one-key, match: {keys: ['00000000']}}]"
    config.write_text(config_text(engine, "required: true", rules=rules))
    red = keys_cli(config, "create", "--team", "red")["key"]
    blue = keys_cli(config, "create", "--team", "blue")["key"]
    gw = GatewayProcess(config, cache_dir)
    try:

        def rule(key: str) -> str | None:
            c = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0)
            raw = c.chat.completions.with_raw_response.create(model="fast", messages=HI, max_tokens=1)
            return raw.headers.get("x-enginegate-rule")

        assert rule(red) == "red-team"
        assert rule(blue) is None  # neither the team rule nor the other key's
    finally:
        gw.stop()

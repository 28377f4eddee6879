"""API keys against a real ``enginegate serve`` process, as the official ``openai`` client sees them:
401 for missing, wrong, placeholder and revoked keys, 403 outside a key's models, 429 with OpenAI's
x-ratelimit headers; keys never in logs, metrics or errors; usage in the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.abuse.probes import Engine
from tests.conftest import GatewayProcess
from tests.polling import wait_until
from tests.tenancy.gateways import config_text, keys_cli

HI: Any = [{"role": "user", "content": "hi"}]
ADMIN_KEY = "admin-key-for-scrapes"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> Path:
    path = tmp_path_factory.mktemp("keys") / "gateway.yaml"
    # With keys required, /metrics asks for a key: the admin key, without a metrics key of its own.
    auth = "required: true, cache_s: 0.2, usage_flush_s: 0.2"
    path.write_text(config_text(engine, auth, admin="api_key_env: EG_TEST_ADMIN"))
    return path


@pytest.fixture(scope="module")
def gateway(config: Path, cache_dir: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": ADMIN_KEY})
    yield gw
    gw.stop()


def client(gw: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=key, max_retries=0, timeout=30)


def test_missing_wrong_and_placeholder_keys_are_authentication_errors(gateway: GatewayProcess, config: Path) -> None:
    real = keys_cli(config, "create", "--name", "probe")["key"]
    forged = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")  # the right id, the wrong secret
    for key in ("unused", "sk-eg-00000000_" + "x" * 43, forged):
        with pytest.raises(openai.AuthenticationError) as err:
            client(gateway, key).chat.completions.create(model="fast", messages=HI, max_tokens=2)
        assert err.value.status_code == 401
        assert err.value.code == "invalid_api_key"
        assert key.split("_", 1)[-1] not in err.value.message  # never the secret
    no_key = httpx.post(f"{gateway.base_url}/v1/chat/completions", json={"model": "fast", "messages": HI})
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "unused").models.list()


def test_a_key_uses_only_its_models_and_sees_only_them(gateway: GatewayProcess, config: Path) -> None:
    key = keys_cli(config, "create", "--models", "fa*")["key"]
    c = client(gateway, key)
    assert c.chat.completions.create(model="fast", messages=HI, max_tokens=2).choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError) as err:
        c.chat.completions.create(model="slow", messages=HI, max_tokens=2)
    assert err.value.code == "model_not_allowed"
    assert [m.id for m in c.models.list()] == ["fast"]


def test_rate_limited_requests_get_openais_429_and_headers(gateway: GatewayProcess, config: Path) -> None:
    key = keys_cli(config, "create", "--rpm", "2", "--tpm", "1000")["key"]
    c = client(gateway, key)
    first = c.chat.completions.with_raw_response.create(model="fast", messages=HI, max_tokens=10)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "1000"
    reserved = 1000 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert reserved >= 10  # the prompt and the 10 tokens asked for, reserved at admission
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    c.chat.completions.create(model="fast", messages=HI, max_tokens=10)
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="fast", messages=HI, max_tokens=10)
    assert err.value.code == "rate_limit_exceeded"
    assert err.value.type == "requests"
    headers = err.value.response.headers
    assert 55 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_a_request_that_can_never_fit_the_token_limit_is_a_400_naming_it_before_any_engine(
    gateway: GatewayProcess, config: Path, engine: Engine
) -> None:
    key = keys_cli(config, "create", "--tpm", "100")["key"]
    before = engine.stats()["started"]
    with pytest.raises(openai.BadRequestError) as err:
        client(gateway, key).chat.completions.create(model="fast", messages=HI, max_tokens=200)
    assert err.value.code == "exceeds_key_token_limit" and err.value.param == "max_tokens"
    # "hi" is estimated (no tokenizer for this model) and reserved as 10 tokens: 90 are left for the answer.
    assert "allows 100 tokens per minute" in err.value.message and "at most 90" in err.value.message
    assert engine.stats()["started"] == before


def test_without_max_tokens_a_small_token_limit_caps_the_reservation_and_the_answer(
    gateway: GatewayProcess, config: Path, engine: Engine
) -> None:
    key = keys_cli(config, "create", "--tpm", "40")["key"]
    c = client(gateway, key)
    raw = c.chat.completions.with_raw_response.create(model="fast", messages=HI)  # default reservation: 4096
    answer = raw.parse()
    assert raw.headers["x-ratelimit-remaining-tokens"] == "0"  # the whole window reserved, no more
    assert answer.usage is not None and answer.usage.completion_tokens == 30  # 40 minus the prompt's 10
    assert answer.choices[0].finish_reason == "length"
    # The window is full until the first settles with its real use (38): then the next waits, with Retry-After.
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="fast", messages=HI)
    assert int(err.value.response.headers["retry-after"]) >= 1


def test_without_max_tokens_the_reservation_is_the_gateways_cap_within_the_context(
    gateway: GatewayProcess, config: Path
) -> None:
    key = keys_cli(config, "create", "--tpm", "100000")["key"]
    raw = client(gateway, key).completions.with_raw_response.create(model="fast", prompt="hi" * 20)
    remaining = int(raw.headers["x-ratelimit-remaining-tokens"])
    assert 100000 - remaining == 4096  # context 4096: the prompt plus all the room after it


def test_disabled_expired_and_revoked_keys_stop_working(gateway: GatewayProcess, config: Path) -> None:
    made = keys_cli(config, "create")
    key, key_id = made["key"], made["id"]
    c = client(gateway, key)
    c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
    keys_cli(config, "update", key_id, "--disable")
    wait_until(refused_with(c, "disabled"), timeout=5, message="a disabled key kept working")
    keys_cli(config, "update", key_id, "--enable")
    wait_until(lambda: not refused_with(c, "disabled")(), timeout=5, message="an enabled key stayed refused")
    keys_cli(config, "update", key_id, "--expires-at", "1")
    wait_until(refused_with(c, "expired"), timeout=5, message="an expired key kept working")
    assert keys_cli(config, "revoke", key_id)["revoked_at"] is not None
    wait_until(refused_with(c, "revoked"), timeout=5, message="a revoked key kept working")


def refused_with(c: openai.OpenAI, why: str) -> Any:
    def check() -> bool:
        try:
            c.chat.completions.create(model="fast", messages=HI, max_tokens=2)
        except openai.AuthenticationError as exc:
            return why in exc.message
        return False

    return check


def test_usage_is_recorded_per_key_and_model_and_keys_stay_out_of_logs_and_metrics(
    gateway: GatewayProcess, config: Path
) -> None:
    made = keys_cli(config, "create", "--team", "red")
    c = client(gateway, made["key"])
    for _ in range(3):
        c.chat.completions.create(model="fast", messages=HI, max_tokens=5)
    stream = c.chat.completions.create(
        model="slow", messages=HI, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    assert sum(1 for _ in stream) > 0

    def usage() -> Any:
        doc = keys_cli(config, "usage", made["id"])
        return doc if doc["total"]["requests"] == 4 else None

    doc = wait_until(usage, timeout=10, message="usage did not reach the database")
    # The engine reports 8 prompt tokens and max_tokens completion tokens; $1000/M in, $2000/M out.
    assert doc["by_model"]["fast"] == {
        "requests": 3, "prompt_tokens": 24, "completion_tokens": 15, "cached_tokens": 0, "cost_usd": 0.054,
    }  # fmt: skip
    assert doc["by_model"]["slow"]["completion_tokens"] == 4
    assert httpx.get(f"{gateway.base_url}/metrics").status_code == 401  # per-team spend is not for anyone
    metrics = httpx.get(f"{gateway.base_url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'enginegate_team_tokens_total{kind="completion",team="red"} 19.0' in metrics
    assert 'enginegate_team_spend_usd_total{team="red"}' in metrics
    secret = made["key"].split("_", 1)[1]
    log = gateway.log.read_text()
    assert made["id"] in log  # the id names the key in the request log
    assert secret not in log and secret not in metrics


def test_a_request_costing_more_than_the_whole_budget_is_a_400_naming_it(
    gateway: GatewayProcess, config: Path, engine: Engine
) -> None:
    key = keys_cli(config, "create", "--budget-usd", "0.05", "--budget-period", "day")["key"]
    before = engine.stats()["started"]
    with pytest.raises(openai.BadRequestError) as err:  # 10 prompt tokens at $1000/M, 100 out at $2000/M: $0.21
        client(gateway, key).chat.completions.create(model="fast", messages=HI, max_tokens=100)
    assert err.value.code == "exceeds_key_budget" and err.value.param == "max_tokens"
    assert "$0.05 per day" in err.value.message and "$0.21" in err.value.message
    assert engine.stats()["started"] == before
    assert client(gateway, key).chat.completions.create(model="fast", messages=HI, max_tokens=10).usage

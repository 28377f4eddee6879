"""Weighted splits through a real gateway server (uvicorn in a thread, scripted engines): the traffic
each arm gets, stickiness per conversation, the arm in the answer and the metrics, weights changed by
reload, and the canary guard stopping an arm whose engine fails."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_config
from routing.features import features
from routing.split import point
from tests.conftest import write_config
from tests.fakes import UPSTREAM_ERROR, ScriptedBackend, factory, serve_in_thread

ADMIN = {"authorization": "Bearer split-admin"}
CONFIG = """
admin: {api_key_env: EG_SPLIT_ADMIN}
models: [{name: m}]
backends:
  - {name: main-1, engine: vllm, model: m, url: "http://127.0.0.1:9", pool: main, cost_per_hour: 2.0}
  - {name: main-2, engine: vllm, model: m, url: "http://127.0.0.1:9", pool: main, cost_per_hour: 2.0}
  - {name: canary, engine: trtllm_serve, model: m, url: "http://127.0.0.1:9", cost_per_hour: 4.0}
routing:
  breaker: {threshold: 10000}
  rules:
    - name: trial
      match: {models: [m]}
      split: [{to: main, weight: %s}, {to: canary, weight: %s}]
"""


def fleet() -> dict[str, ScriptedBackend]:
    return {name: ScriptedBackend(name, "m") for name in ("main-1", "main-2", "canary")}


def ask(client: httpx.Client, conversation: int, turns: int = 1) -> httpx.Response:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"conversation {conversation}"}]
    for turn in range(1, turns):
        messages += [{"role": "assistant", "content": "fine answer"}, {"role": "user", "content": f"and {turn}?"}]
    return client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 8})


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


@pytest.fixture(autouse=True)
def _admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EG_SPLIT_ADMIN", "split-admin")


def test_a_95_5_split_over_2000_requests_lands_within_one_and_a_half_points_and_conversations_stay(
    tmp_path: Path,
) -> None:
    fakes = fleet()
    app = create_app(load_config(write_config(tmp_path / "c.yaml", CONFIG % (95, 5))), factory(dict(fakes)))
    arms: Counter[str] = Counter()
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        first: dict[int, str] = {}
        for i in range(2000):
            r = ask(client, i)
            assert r.status_code == 200, r.text
            first[i] = r.headers["x-enginegate-arm"]
            arms[first[i]] += 1
        # Later turns of a conversation (its history grows) stay on the arm of its first.
        for i in range(0, 2000, 10):
            for turns in (2, 3):
                r = ask(client, i, turns)
                assert r.status_code == 200 and r.headers["x-enginegate-arm"] == first[i], (i, turns)
                if first[i] == "canary":
                    assert r.headers["x-enginegate-backend"] == "canary"
        served = {arm: metric(client, "enginegate_split_requests_total", rule="trial", arm=arm, outcome="ok")
                  for arm in ("main", "canary")}  # fmt: skip
        ttft = metric(client, "enginegate_split_time_to_first_token_seconds_count", rule="trial", arm="canary")
        tokens = metric(client, "enginegate_split_tokens_total", rule="trial", arm="canary", kind="completion")
        cost = metric(client, "enginegate_split_cost_dollars_total", rule="trial", arm="canary")
    assert sum(arms.values()) == 2000 and set(arms) == {"main", "canary"}
    assert abs(arms["canary"] / 20 - 5) <= 1.5, arms
    later = sum(2 for i in range(0, 2000, 10) if first[i] == "canary")
    assert fakes["canary"].calls == arms["canary"] + later  # the arm's requests went to its backend only
    assert fakes["main-1"].calls + fakes["main-2"].calls == 2400 - fakes["canary"].calls
    assert served == {"main": 2400 - fakes["canary"].calls, "canary": fakes["canary"].calls}
    assert ttft == fakes["canary"].calls and tokens == 2 * fakes["canary"].calls and cost > 0


def test_a_reload_changes_the_weights_and_a_raised_canary_keeps_its_conversations(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", CONFIG % (90, 10))
    app = create_app(load_config(path), factory(dict(fleet())))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        before = {i: ask(client, i).headers["x-enginegate-arm"] for i in range(600)}
        write_config(path, CONFIG % (60, 40))
        assert client.post("/admin/reload", headers=ADMIN).json()["status"] == "reloaded"
        after = {i: ask(client, i).headers["x-enginegate-arm"] for i in range(600)}
        weights = [a["weight"] for a in client.get("/admin/splits", headers=ADMIN).json()["trial"]["arms"]]
    # Each conversation's arm is exactly where the weights in force put its opening's hash.
    assert before == {i: placed(i, 90) for i in range(600)} and after == {i: placed(i, 60) for i in range(600)}
    canary_before = {i for i, arm in before.items() if arm == "canary"}
    canary_after = {i for i, arm in after.items() if arm == "canary"}
    assert len(canary_before) > 30 and len(canary_after) > 3 * len(canary_before)
    assert canary_before < canary_after and weights == [60, 40]


def placed(conversation: int, control_weight: float) -> str:
    """The arm a first turn of ``ask`` lands on under the weights (control_weight, 100 - control_weight)."""
    f = features("m", ["Be brief.", f"conversation {conversation}"], 8, False, {}, roles=["system", "user"])
    return "main" if point("trial", f"conversation:{f.prefix_hash}") < control_weight else "canary"


def test_the_guard_stops_a_failing_canary_says_so_and_a_reload_resumes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fakes = fleet()
    fakes["canary"].fail_with = UPSTREAM_ERROR  # every answer fails before its first token
    guarded = (CONFIG % (50, 50)) + "      guard: {max_error_rate_delta: 0.2, min_requests: 20}\n"
    path = write_config(tmp_path / "c.yaml", guarded)
    app = create_app(load_config(path), factory(dict(fakes)))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        answers = [ask(client, i) for i in range(200)]
        splits = client.get("/admin/splits", headers=ADMIN).json()["trial"]
        stopped = metric(client, "enginegate_split_arm_stopped", rule="trial", arm="canary")
        errors = metric(client, "enginegate_split_errors_total", rule="trial", arm="canary")
        assert client.post("/admin/reload", headers=ADMIN).json()["status"] == "reloaded"
        resumed = client.get("/admin/splits", headers=ADMIN).json()["trial"]["arms"][1]
        resumed_metric = metric(client, "enginegate_split_arm_stopped", rule="trial", arm="canary")
    failed = [i for i, r in enumerate(answers) if r.status_code != 200]
    # Every canary request failed until the guard judged it (both arms at 20 requests), then none did.
    assert 20 <= len(failed) == fakes["canary"].calls == errors <= 40, failed
    assert all(answers[i].headers["x-enginegate-arm"] == "canary" for i in failed)
    assert all(r.status_code == 200 and r.headers["x-enginegate-arm"] == "main" for r in answers[failed[-1] + 1 :])
    assert len(answers) - failed[-1] > 100  # the stop came early: most of the traffic was after it
    canary = splits["arms"][1]
    assert splits["control"] == "main" and canary["stopped"] and canary["errors"] == len(failed)
    assert canary["reason"].startswith("error rate 1.000 against the control's 0.000")
    assert stopped == 1.0 and not resumed["stopped"] and resumed["requests"] == 0 and resumed_metric == 0.0
    said = [r for r in caplog.records if r.name == "enginegate.split" and r.msg.startswith("canary arm stopped")]
    assert len(said) == 1 and getattr(said[0], "arm", None) == "canary"
    logged = {getattr(r, "arm", None) for r in caplog.records if r.name == "enginegate.request" and r.msg == "request"}
    assert {"main", "canary"} <= logged


MODEL_ARM = """
models: [{name: m}, {name: m-next}]
backends:
  - {name: main-1, engine: vllm, model: m, url: "http://127.0.0.1:9"}
  - {name: next-1, engine: vllm, model: m-next, url: "http://127.0.0.1:9"}
routing:
  rules:
    - name: try-next
      match: {models: [m]}
      split: [{to: main-1, weight: 70}, {to: m-next, weight: 30}]
"""


def test_an_arm_naming_another_model_answers_a_share_in_that_models_name(tmp_path: Path) -> None:
    """A 70/30 split between a backend of the model asked and another model: the other model's arm
    is answered by that model's backend, in its name (body and ``x-enginegate-model``), whole and
    streamed, and each conversation stays on its arm."""
    fakes = {"main-1": ScriptedBackend("main-1", "m"), "next-1": ScriptedBackend("next-1", "m-next")}
    app = create_app(load_config(write_config(tmp_path / "c.yaml", MODEL_ARM)), factory(dict(fakes)))
    arms: Counter[str] = Counter()
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        for i in range(200):
            r = ask(client, i)
            assert r.status_code == 200, r.text
            arm, named = r.headers["x-enginegate-arm"], r.json()["model"]
            assert named == r.headers["x-enginegate-model"] == ("m-next" if arm == "m-next" else "m")
            assert r.headers["x-enginegate-backend"] == ("next-1" if arm == "m-next" else "main-1")
            arms[arm] += 1
            if i % 20 == 0:  # the same conversation streamed, a turn later: the same arm and model
                turns = [
                    {"role": "system", "content": "Be brief."}, {"role": "user", "content": f"conversation {i}"},
                    {"role": "assistant", "content": "fine answer"}, {"role": "user", "content": "and 1?"},
                ]  # fmt: skip
                body = {"model": "m", "stream": True, "max_tokens": 8, "messages": turns}
                streamed = client.post("/v1/chat/completions", json=body)
                assert streamed.headers["x-enginegate-arm"] == arm
                assert f'"model":"{named}"' in streamed.text.replace(" ", "")
    assert 30 <= arms["m-next"] <= 90 and arms["m-next"] + arms["main-1"] == 200  # 30% of 200, loosely
    assert fakes["next-1"].calls >= arms["m-next"] and fakes["main-1"].calls >= arms["main-1"]

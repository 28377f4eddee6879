"""Weighted splits and canaries as routing sees them: the arm a request lands on (weights, stickiness,
a stable hash), an arm that cannot serve, the guard's verdict, and the config errors of a split."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import ConfigError, RuleConfig, parse_config
from gateway.telemetry.arms import ArmEnd, Splits
from routing.decisions import Reason
from routing.features import features
from routing.rules import Arm, Rule, Rules, Split
from routing.split import ArmCounts, Guard, arm_order, point, route, verdict
from routing.types import FleetSnapshot, RequestFeatures
from tests.conftest import ROOT
from tests.unit.test_routing import LLAMA_8B, backend

FLEET = (
    backend("vllm-1", "vllm", "A100-80GB", pool="vllm-pool"),
    backend("vllm-2", "vllm", "A100-80GB", pool="vllm-pool"),
    backend("trt-canary", "trtllm_serve", "H100"),
)


def rules(*weights: float, sticky: str = "conversation") -> Rules:
    arms = (Arm("vllm-pool", ("vllm-pool",), weights[0]), Arm("trt-canary", ("trt-canary",), weights[1]))
    rule = Rule("canary", models=("llama-8b",), split=Split(arms, sticky))
    return Rules((rule,))


def chat(opening: str, turns: int = 1, **kw: object) -> RequestFeatures:
    """A conversation's request after ``turns`` user turns: its opening stays, its tail grows."""
    texts, roles = ["You are terse."], ["system"]
    for turn in range(turns):
        texts += [f"{opening} (turn {turn})" if turn else opening, "an answer"]
        roles += ["user", "assistant"]
    return replace(features("llama-8b", texts[:-1], 64, False, {}, roles=roles[:-1]), **kw)  # type: ignore[arg-type]


def snapshot(*states: object) -> FleetSnapshot:
    return FleetSnapshot(states or FLEET, {"llama-8b": LLAMA_8B})  # type: ignore[arg-type]


def test_a_95_5_split_over_2000_conversations_lands_within_one_and_a_half_points() -> None:
    asked = [chat(f"conversation {i}: tell me about {i * 7919}") for i in range(2000)]
    decisions = [route(f, snapshot(), rules(95, 5)) for f in asked]
    canary = sum(d.arm == "trt-canary" for d in decisions)
    assert abs(canary / 2000 * 100 - 5) <= 1.5, canary
    # The arm restricts the candidates: the canary's requests go to the canary only, the rest to the pool.
    assert all(
        {c.backend for c in d.candidates} == ({"trt-canary"} if d.arm == "trt-canary" else {"vllm-1", "vllm-2"})
        for d in decisions
    )


def test_every_turn_of_a_conversation_lands_on_the_arm_of_its_first() -> None:
    arms = {}
    for i in range(300):
        seen = {route(chat(f"question {i}", turns), snapshot(), rules(50, 50)).arm for turns in (1, 2, 3, 4)}
        assert len(seen) == 1, (i, seen)
        arms[i] = seen.pop()
    assert 100 < sum(a == "trt-canary" for a in arms.values()) < 200  # and the conversations do spread


def test_sticky_by_header_keeps_a_user_on_one_arm_across_conversations_and_falls_back_without_it() -> None:
    by_user = rules(50, 50, sticky="header:x-user-id")
    for user in range(100):
        asked = [chat(f"topic {c} of {user}", headers=(("x-user-id", f"u{user}"),)) for c in range(4)]
        assert len({route(f, snapshot(), by_user).arm for f in asked}) == 1, user
    # Without the header, the conversation decides, as with the default.
    bare = [chat(f"topic {c}") for c in range(200)]
    assert [route(f, snapshot(), by_user).arm for f in bare] == [route(f, snapshot(), rules(50, 50)).arm for f in bare]


def test_sticky_by_key_keeps_an_api_key_on_one_arm() -> None:
    by_key = rules(50, 50, sticky="key")
    for key in range(50):
        assert len({route(chat(f"t{c}", key=f"k{key}"), snapshot(), by_key).arm for c in range(5)}) == 1


def test_the_arm_is_the_same_in_every_process() -> None:
    """A stable hash, not Python's salted ``hash()``: gateway replicas and restarts agree."""
    here = [point("canary", f"conversation:{i}") for i in range(20)]
    code = "from routing.split import point; print([point('canary', f'conversation:{i}') for i in range(20)])"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert out.stdout.strip() == str(here)


def test_raising_the_canary_weight_keeps_every_caller_it_had() -> None:
    asked = [chat(f"conversation {i}") for i in range(500)]
    before = {i for i, f in enumerate(asked) if route(f, snapshot(), rules(95, 5)).arm == "trt-canary"}
    after = {i for i, f in enumerate(asked) if route(f, snapshot(), rules(80, 20)).arm == "trt-canary"}
    assert before < after and len(after) > 3 * len(before)


def test_an_arm_without_a_healthy_backend_sends_its_requests_to_the_control() -> None:
    down = replace(FLEET[2], healthy=False)
    asked = [chat(f"conversation {i}") for i in range(400)]
    canary = [f for f in asked if route(f, snapshot(), rules(50, 50)).arm == "trt-canary"]
    assert canary
    for f in canary:
        d = route(f, snapshot(FLEET[0], FLEET[1], down), rules(50, 50))
        assert d.arm == "vllm-pool" and d.candidates and d.candidates[0].backend.startswith("vllm-")
    # The control down as well: the request's own arm's refusal, which says why (503, no healthy backend).
    both = snapshot(replace(FLEET[0], healthy=False), replace(FLEET[1], healthy=False), down)
    d = route(canary[0], both, rules(50, 50))
    assert not d.candidates and d.arm == "trt-canary" and d.reason is Reason.NO_HEALTHY_BACKEND


def test_a_stopped_arm_sends_its_requests_to_the_control_and_the_control_is_never_skipped() -> None:
    rule = rules(50, 50).rules[0]
    stopped = frozenset({("canary", "trt-canary")})
    for i in range(200):
        order = arm_order(rule, chat(f"c{i}"), stopped)
        assert [a.name for a in order] == ["vllm-pool"]
        assert route(chat(f"c{i}"), snapshot(), rules(50, 50), stopped).arm == "vllm-pool"


def test_requests_no_split_rule_matches_are_routed_as_before() -> None:
    other = chat("hello")
    other = replace(other, model="llama-70b")
    plain = Rules((Rule("canary", models=("llama-8b",)),))
    assert route(other, snapshot(), rules(50, 50)) == route(other, snapshot(), plain)
    assert route(other, snapshot(), rules(50, 50)).arm is None


def test_the_guard_waits_for_its_sample_and_then_stops_an_arm_beyond_the_margin() -> None:
    guard = Guard(max_error_rate_delta=0.05, max_budget_miss_delta=0.1, min_requests=100)
    control = ArmCounts(requests=1000, errors=10, budgeted=500, missed=50)
    assert verdict(guard, control, ArmCounts(requests=99, errors=99)) is None  # too few to judge
    assert verdict(guard, control, ArmCounts(requests=100, errors=6)) is None  # 6% against 1%: within 5 points
    why = verdict(guard, control, ArmCounts(requests=100, errors=7))
    assert why is not None and why.startswith("error rate 0.070 against the control's 0.010")
    assert verdict(guard, control, ArmCounts(requests=200, budgeted=100, missed=20)) is None  # 20% against 10%
    why = verdict(guard, control, ArmCounts(requests=200, budgeted=100, missed=21))
    assert why is not None and why.startswith("budget-miss rate 0.210")
    assert verdict(guard, ArmCounts(requests=99), ArmCounts(requests=500, errors=500)) is None  # control too small


FLEET_YAML = """
models: [{name: m}, {name: other}, {name: vectors, kind: embed}]
backends:
  - {name: v1, engine: vllm, model: m, url: "http://127.0.0.1:9", pool: vllm-pool}
  - {name: v2, engine: vllm, model: m, url: "http://127.0.0.1:9", pool: vllm-pool}
  - {name: trt, engine: trtllm_serve, model: m, url: "http://127.0.0.1:9"}
  - {name: o, engine: vllm, model: other, url: "http://127.0.0.1:9"}
routing:
  rules:
    - name: canary
      match: {models: [m]}
"""


def test_an_arm_may_name_another_model(tmp_path: Path) -> None:
    """An arm naming a model (not a backend or pool) sends its share of the rule's requests to that model."""
    from gateway.config import load_config
    from gateway.fleet.catalog import rules

    path = tmp_path / "c.yaml"
    path.write_text(FLEET_YAML + "      split: [{to: vllm-pool, weight: 90}, {to: other, weight: 10}]\n")
    loaded = load_config(path)
    (rule,) = rules(loaded).rules
    assert rule.split is not None
    assert [(a.name, a.targets, a.model) for a in rule.split.arms] == [
        ("vllm-pool", ("vllm-pool",), None), ("other", (), "other"),
    ]  # fmt: skip


def problems(rule_tail: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(FLEET_YAML + rule_tail, "c.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("      split: [{to: vllm-pool, weight: 90}, {to: trt, weight: 5}]\n",
         "c.yaml:12: routing.rules[0].split: the arms' weights must sum to 100 (they sum to 95)"),
        ("      split: [{to: vllm-pool, weight: 100}, {to: trt, weight: 0}]\n",
         "c.yaml:12: routing.rules[0].split[1].weight: Input should be greater than 0"),
        ("      split: [{to: vllm-pool, weight: 105}, {to: trt, weight: -5}]\n",
         "c.yaml:12: routing.rules[0].split[0].weight: Input should be less than or equal to 100"),
        ("      split: [{to: vllm-pool, weight: 95}, {to: trt-canary, weight: 5}]\n",
         "c.yaml:12: routing.rules[0].split[1].to: 'trt-canary' is neither a backend, a pool nor a model"),
        ("      split: [{to: vllm-pool, weight: 95}, {to: vectors, weight: 5}]\n",
         "c.yaml:12: routing.rules[0].split[1].to: an arm naming a model splits generation models only ('vectors'"
         " embeds)"),
        ("      split: [{to: vllm-pool, weight: 95}, {to: o, weight: 5}]\n",
         "c.yaml:12: routing.rules[0].split[1].to: 'o' cannot serve model 'm', which the rule matches"),
        ("      split: [{to: vllm-pool, weight: 100}]\n",
         "c.yaml:12: routing.rules[0].split: needs two arms or more"),
        ("      split: [{to: trt, weight: 50}, {to: trt, weight: 50}]\n",
         "c.yaml:12: routing.rules[0].split: arm 'trt' appears twice"),
        ("      require: [trt]\n      split: [{to: vllm-pool, weight: 50}, {to: trt, weight: 50}]\n",
         "c.yaml:10: routing.rules[0]: split: and require: exclude each other"),
        ("      guard: {max_error_rate_delta: 0.05}\n", "c.yaml:10: routing.rules[0]: sticky: and guard: need split:"),
        ("      split: [{to: vllm-pool, weight: 50}, {to: trt, weight: 50}]\n      guard: {min_requests: 10}\n",
         "c.yaml:13: routing.rules[0].guard: give max_error_rate_delta, max_budget_miss_delta or both"),
        ("      split: [{to: vllm-pool, weight: 50}, {to: trt, weight: 50}]\n      sticky: {by: header}\n",
         "c.yaml:13: routing.rules[0].sticky: by: header needs header:"),
        ("      split: [{to: vllm-pool, weight: 50}, {to: trt, weight: 50}]\n"
         "    - name: canary\n      match: {models: [other]}\n",
         "c.yaml:10: routing.rules[0].name: 'canary' is used twice"),
    ],
)  # fmt: skip
def test_a_bad_split_is_a_config_error_with_file_line_and_key(tail: str, expected: str) -> None:
    found = problems(tail)
    assert any(p.startswith(expected) for p in found), found


def test_a_rule_matching_every_model_needs_arms_that_serve_every_model() -> None:
    text = FLEET_YAML.replace("      match: {models: [m]}\n", "") + (
        "      split: [{to: vllm-pool, weight: 95}, {to: trt, weight: 5}]\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert "routing.rules[0].split[0].to: 'vllm-pool' cannot serve model 'other'" in "\n".join(info.value.problems)


def test_a_good_split_loads_into_routing_rules() -> None:
    from gateway.config import LoadedConfig
    from gateway.fleet.catalog import rules as build_rules

    config, _ = parse_config(
        FLEET_YAML + "      split: [{to: vllm-pool, weight: 95.5}, {to: trt, weight: 4.5, name: canary-arm}]\n"
        "      sticky: {header: x-user-id}\n      guard: {max_error_rate_delta: 0.05}\n",
        "c.yaml",
    )
    built = build_rules(LoadedConfig(config, ROOT / "c.yaml"))
    assert built.splits and built.rules[0].split == Split(
        (Arm("vllm-pool", ("vllm-pool",), 95.5), Arm("canary-arm", ("trt",), 4.5)), "header:x-user-id"
    )


def test_the_guard_stops_a_canary_that_misses_budgets_and_ignores_what_tells_nothing_of_the_arm() -> None:
    registry = CollectorRegistry()
    splits = Splits(registry)
    splits.configure([
        RuleConfig.model_validate({
            "name": "trial", "split": [{"to": "a", "weight": 90}, {"to": "b", "weight": 10}],
            "guard": {"max_budget_miss_delta": 0.2, "min_requests": 10},
        })
    ])  # fmt: skip
    for _ in range(10):
        splits.ended(ArmEnd("trial", "a", "ok", False, budget_met=True))
        # Cancelled requests, refusals before any engine and answers without a budget tell nothing.
        splits.ended(ArmEnd("trial", "b", "cancelled", False))
        splits.ended(ArmEnd("trial", "b", "error", False))
        splits.ended(ArmEnd("trial", "b", "ok", False))
    for i in range(10):
        assert not splits.stopped, i
        splits.ended(ArmEnd("trial", "b", "ok", False, budget_met=i < 7))  # 3 misses of 10: 30 points over 0
    assert splits.stopped == {("trial", "b")}
    arms = splits.describe()["trial"]["arms"]
    assert arms[1]["reason"].startswith("budget-miss rate 0.300 against the control's 0.000 (over 10 and 10")
    assert arms[1]["requests"] == 20 and arms[1]["budgeted"] == 10  # the answers without a budget count as requests
    assert registry.get_sample_value("enginegate_split_arm_stopped", {"rule": "trial", "arm": "b"}) == 1
    missed = {"rule": "trial", "arm": "b", "result": "missed"}
    assert registry.get_sample_value("enginegate_split_budgets_total", missed) == 3

"""Shadow traffic's pieces without engines: its config checks, the pair's agreement, the report's sums
(``tests/integration/test_shadow.py`` runs it against contract fakes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from gateway.config import ConfigError, parse_config
from gateway.telemetry.shadow_pairs import PairInfo, Side, comparison, similarity
from gateway.telemetry.shadow_report import met, percentile, render, summarize
from gateway.telemetry.shadows import Shadows

BASE = """
models: [{name: m}, {name: m2}]
backends:
  - {name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}
  - {name: b, engine: trtllm_serve, model: m, url: "http://127.0.0.1:9", pool: trt}
routing:
  rules:
    - name: r
      shadow: SHADOW
"""


def problems(shadow: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE.replace("SHADOW", shadow), "f.yaml")
    return info.value.problems


def test_a_shadow_names_a_backend_a_pool_or_a_model() -> None:
    for to in ("b", "trt", "m2"):
        config, _ = parse_config(BASE.replace("SHADOW", f"{{to: {to}, share: 0.1}}"), "f.yaml")
        shadow = config.routing.rules[0].shadow
        assert shadow is not None and shadow.to == to and shadow.max_concurrency == 8
    [problem] = problems("{to: nowhere, share: 0.1}")
    assert problem.startswith("f.yaml:") and "routing.rules[0].shadow.to: 'nowhere' is neither" in problem
    with pytest.raises(ConfigError) as info:  # a model and a pool of one name: which one is meant?
        parse_config(BASE.replace("SHADOW", "{to: m2, share: 0.1}").replace("pool: trt", "pool: m2"), "f.yaml")
    assert "'m2' names a model and a backend or pool" in info.value.problems[0]


@pytest.mark.parametrize(
    ("shadow", "key"),
    [
        ("{to: b, share: 0}", "routing.rules[0].shadow.share"),
        ("{to: b, share: 1.5}", "routing.rules[0].shadow.share"),
        ("{to: b}", "routing.rules[0].shadow.share"),
        ("{to: b, share: 0.5, max_concurrency: 0}", "routing.rules[0].shadow.max_concurrency"),
        ("{to: b, share: 0.5, mirror: yes}", "routing.rules[0].shadow.mirror"),
    ],
)
def test_a_bad_shadow_is_refused_with_its_line(shadow: str, key: str) -> None:
    [problem] = problems(shadow)
    assert problem.startswith("f.yaml:9: ") and key in problem, problem


def test_greedy_answers_agree_only_when_equal_sampled_ones_by_their_words() -> None:
    assert similarity("a b c", "a b c", greedy=True) == ("exact", 1.0)
    assert similarity("a b c", "a b c ", greedy=True) == ("exact", 0.0)
    assert similarity("the cat sat", "the cat ran", greedy=False) == ("jaccard", 0.5)
    assert similarity("", "", greedy=False) == ("jaccard", 1.0)


def _pair(p: dict[str, Any], s: dict[str, Any], budget_ms: float | None = 100.0, greedy: bool = True) -> dict[str, Any]:
    info = PairInfo("rid", "r", "trt", "m", greedy, False, budget_ms, None, None)
    primary = Side("a", "m", p.pop("outcome", "ok"), **p)
    shadow = Side("b", "m", s.pop("outcome", "ok"), **s)
    return comparison(info, primary, shadow, 0.5)


def test_the_summary_counts_budgets_agreement_times_tokens_and_cost() -> None:
    fast = {"ttft_s": 0.05, "e2e_s": 0.2, "completion_tokens": 16, "finish_reason": "stop", "text": "x y",
            "cost_usd": 0.001}  # fmt: skip
    slow = {**fast, "ttft_s": 0.15, "cost_usd": 0.0005, "finish_reason": "length"}
    records = [
        _pair(dict(fast), dict(fast)),
        _pair(dict(fast), dict(slow)),  # the candidate misses the 100 ms first-token budget
        _pair(dict(fast), {"outcome": "error", "ttft_s": None, "error": "upstream"}),
        _pair(dict(fast), dict(fast, text="x z"), budget_ms=None),  # no budget; texts differ
    ]
    assert met(records[1]["shadow"], records[1]["budget"]) is False and met(records[3]["shadow"], {}) is None
    [row] = summarize(records)
    assert (row["rule"], row["primary_backend"], row["candidate_backend"]) == ("r", "a", "b")
    assert (row["pairs"], row["shadow_failures"], row["compared"], row["with_budget"]) == (4, 1, 3, 3)
    assert row["agreement"] == round(2 / 3, 4)
    assert row["primary"]["budgets_met"] == 1.0 and row["candidate"]["budgets_met"] == round(1 / 3, 4)
    assert row["primary"]["ttft_ms"] == {"p50": 50.0, "p99": 50.0}
    assert row["candidate"]["ttft_ms"] == {"p50": 50.0, "p99": 150.0}
    assert row["primary"]["completion_tokens"] == 64 and row["candidate"]["completion_tokens"] == 48
    assert row["candidate"]["finish_reasons"] == {"length": 1, "stop": 2, "upstream": 1}
    assert row["primary"]["cost_usd"] == pytest.approx(0.004)
    assert row["candidate"]["cost_per_million_tokens"] == pytest.approx(0.0025 / 48 * 1e6, rel=1e-3)
    text = render([row])
    assert "budgets met: candidate 33.3% vs primary 100.0% (of 3 pairs with a budget)" in text
    assert "TTFT ms p50/p99" in text


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_a_rules_slots_bound_its_shadows_and_plans_follow_the_config() -> None:
    book = Shadows(CollectorRegistry(), ring=2)
    assert book.take("r", 2) and book.take("r", 2) and not book.take("r", 2)
    book.release("r")
    assert book.take("r", 2)
    config, _ = parse_config(BASE.replace("SHADOW", "{to: b, share: 1}"), "f.yaml")
    rule = book.plan(config.routing, "r")
    assert rule is not None and rule.shadow is not None and book.plan(config.routing, "other") is None
    reloaded, _ = parse_config(BASE.replace("SHADOW", "null"), "f.yaml")
    assert book.plan(reloaded.routing, "r") is None  # a reload that drops the shadow stops it
    for i in range(3):
        book.record({"i": i}, None)
    assert [d["i"] for d in book.ring] == [1, 2]


def test_the_report_command_names_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["shadow", "report", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: No such file or directory" in capsys.readouterr().err
    log = tmp_path / "pairs.jsonl"
    log.write_bytes(b'{"torn": \n' + orjson.dumps(_pair({}, {})) + b"\n")  # a torn line is skipped
    assert main(["shadow", "report", str(log), "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    assert row["pairs"] == 1

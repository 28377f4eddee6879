"""Trace loading and workload building for the fleet simulator."""

from __future__ import annotations

import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from routing.sim.traces import TraceRow, load_trace, mean_rate
from routing.sim.workload import DEFAULT_MIX, BudgetClass, BudgetMix, build_workload, parse_mix

ROOT = Path(__file__).resolve().parents[2]

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:04.0319601,100,0
2023-11-16 23:59:59.9999999,1,1
2023-11-17 00:00:01.0000000,1,1
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_timestamps_keep_all_seven_fractional_digits(tmp_path):
    rows = load_trace(write(tmp_path, "azure.csv", AZURE))
    assert [r.prompt_tokens for r in rows] == [4808, 3180, 100, 1, 1]
    assert rows[0].arrival_s == 0.0
    assert rows[1].arrival_s == pytest.approx(0.052, abs=1e-9)
    # 100 ns after the previous request: the seventh digit is not dropped.
    assert rows[2].arrival_s - rows[1].arrival_s == pytest.approx(1e-7, abs=1e-9)
    # Across midnight the date counts too.
    assert rows[4].arrival_s - rows[3].arrival_s == pytest.approx(1.0000001, abs=1e-9)


def test_output_tokens_are_at_least_one(tmp_path):
    rows = load_trace(write(tmp_path, "azure.csv", AZURE))
    assert rows[2].output_tokens == 1


def test_generic_csv_and_jsonl_are_relative_to_the_earliest_request(tmp_path):
    csv_rows = load_trace(write(tmp_path, "t.csv", "timestamp,prompt_tokens,output_tokens\n105.5,10,3\n100,20,4\n"))
    assert csv_rows == [TraceRow(0.0, 20, 4), TraceRow(5.5, 10, 3)]
    jsonl = (
        '{"arrival_s": 2.0, "prompt_tokens": 7, "output_tokens": 9}\n\n'
        '{"arrival_s": 3.5, "prompt_tokens": 1, "output_tokens": 2}\n'
    )
    assert load_trace(write(tmp_path, "t.jsonl", jsonl)) == [TraceRow(0.0, 7, 9), TraceRow(1.5, 1, 2)]
    # Without a known extension the content decides.
    assert load_trace(write(tmp_path, "t.log", jsonl)) == load_trace(tmp_path / "t.jsonl")
    spaced = "arrival_s, prompt_tokens, output_tokens\n0,5,6\n"
    assert load_trace(write(tmp_path, "s.csv", spaced)) == [TraceRow(0.0, 5, 6)]


@pytest.mark.parametrize(
    ("name", "text", "line", "fragment"),
    [
        ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,x,1\n", 3, "not an integer"),
        ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n\n2,1\n", 4, "expected 3 fields"),
        ("a.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,-2\n", 2, "negative"),
        ("a.csv", AZURE + "2023-11-16 18:17:0x.1,1,1\n", 7, "neither seconds"),
        ("a.csv", "when,prompt,output\n0,1,1\n", 1, "header"),
        ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{"arrival_s": 1}\n', 2, "needs"),
        ("a.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n', 2, ""),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, name, text, line, fragment):
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:{line}: .*{fragment}"):
        load_trace(path)


def test_empty_trace_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no requests"):
        load_trace(write(tmp_path, "e.csv", "arrival_s,prompt_tokens,output_tokens\n"))


ROWS = [TraceRow(float(i), 100 + i, 10) for i in range(100)]


def test_rate_scale_compresses_arrivals():
    doubled = build_workload(ROWS, rate_scale=2.0)
    assert [r.arrival_s for r in doubled[:3]] == [0.0, 0.5, 1.0]
    assert mean_rate(ROWS) == pytest.approx(1.0)
    assert [r.id for r in doubled] == list(range(100))
    with pytest.raises(ValueError, match="rate_scale"):
        build_workload(ROWS, rate_scale=0)


def test_duration_cuts_simulated_time_after_scaling():
    cut = build_workload(ROWS, rate_scale=2.0, duration_s=10.0)
    assert len(cut) == 20
    assert max(r.arrival_s for r in cut) < 10.0


def test_same_seed_same_budgets_and_shares_are_honoured():
    rows = [TraceRow(i * 0.01, 10, 10) for i in range(10_000)]
    first = build_workload(rows, seed=7)
    assert first == build_workload(rows, seed=7)
    assert [r.klass for r in first] != [r.klass for r in build_workload(rows, seed=8)]
    counts = Counter(r.klass for r in first)
    for klass in DEFAULT_MIX.classes:
        assert counts[klass.name] / len(rows) == pytest.approx(klass.share, abs=0.02)
    agent = next(r for r in first if r.klass == "agent")
    assert (agent.ttft_budget_ms, agent.latency_budget_ms) == (2000, 20000)


def test_parse_mix_reads_the_cli_form():
    mix = parse_mix("interactive:0.6:ttft=500,agent:0.25:ttft=2000:e2e=20000,batch:0.15:e2e=120000")
    assert mix == DEFAULT_MIX
    assert parse_mix("all:1") == BudgetMix((BudgetClass("all", 1.0, None, None),))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a:0.5,b:0.4", "sum to 0.9"),
        ("a", "expected name:share"),
        ("a:half", "share 'half' is not a number"),
        ("a:1:ttl=5", "unknown option 'ttl=5'"),
        ("a:1:ttft=5:ttft=6", "ttft given twice"),
        ("a:1:e2e=soon", "e2e value 'soon'"),
        ("a:1:ttft=-5", "positive"),
        ("a:0.5,a:0.5", "repeats"),
        ("a:1.5,b:-0.5", "not in"),
    ],
)
def test_parse_mix_errors_say_what_is_wrong(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_mix(text)


def test_real_conversation_trace_loads():
    rows = load_trace(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    assert len(rows) == 19366
    assert rows[-1].arrival_s == pytest.approx(3501.7, abs=1.0)
    assert all(a.arrival_s <= b.arrival_s for a, b in pairwise(rows))

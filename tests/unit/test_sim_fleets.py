"""``enginegate simulate`` decides between fleets: absolute rates, chosen policies, several configs side
by side, the bottleneck named, units and failure reasons in the table, a progress bar, plots (issue 25,
item 3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import load_config
from gateway.whatif.fleets import sim_fleet
from routing.sim.capacity import bottleneck, capacities
from routing.sim.report import COLUMNS
from routing.sim.simulate import assign_models
from routing.sim.sweep import compare
from routing.sim.traces import TraceRow
from routing.sim.workload import build_workload
from tests.conftest import write_config

MODELS = """
models:
  - {name: m8, params_b: 8, dtype: bf16, context: 131072, kv_bytes_per_token: 131072}
  - {name: m70, params_b: 70, dtype: bf16, context: 131072, kv_bytes_per_token: 327680}
"""
SMALL = (
    MODELS
    + """
backends:
  - {name: h100-8b, engine: vllm, url: "http://a:8000", model: m8, gpu: H100, cost_per_hour: 4.0}
  - {name: a100x4-70b, engine: vllm, url: "http://b:8000", model: m70, gpu: A100-80GB, gpu_count: 4,
     cost_per_hour: 12.0}
"""
)
BIG = (
    MODELS
    + """
backends:
  - {name: h100-8b-a, engine: vllm, url: "http://a:8000", model: m8, gpu: H100, cost_per_hour: 4.0}
  - {name: h100-8b-b, engine: vllm, url: "http://c:8000", model: m8, gpu: H100, cost_per_hour: 4.0}
  - {name: h100x4-70b, engine: vllm, url: "http://b:8000", model: m70, gpu: H100, gpu_count: 4, cost_per_hour: 16.0}
"""
)
PNG = b"\x89PNG\r\n\x1a\n"


def trace(tmp_path: Path, n: int = 240) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i * 0.25},{300 + i % 500},{30 + i % 80}\n" for i in range(n))
    )
    return path


def test_two_fleets_at_the_same_absolute_rates_with_units_reasons_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small, big = write_config(tmp_path / "small.yaml", SMALL), write_config(tmp_path / "big.yaml", BIG)
    png = tmp_path / "plots" / "fleets.png"
    code = main([
        "simulate", "--config", str(small), "--config", str(big), "--trace", str(trace(tmp_path)),
        "--rate", "2,6", "--policies", "enginegate,round_robin", "--models", "m8:0.7,m70:0.3", "--plot", str(png),
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    header = next(line for line in out.splitlines() if line.startswith("fleet "))
    for column in ("rate req/s", "within budget %", "TTFT p50 ms", "TTFT p99 ms", "e2e p99 s", "busy GPU $/h",
                   "fleet GPU $/h", "shed (503)", "strict 429", "no backend"):  # fmt: skip
        assert column in header, column
    rows = [line.split() for line in out.splitlines() if line.startswith(("small ", "big "))]
    # every fleet x policy at both absolute rates, nothing else
    assert sorted((r[0], r[1], r[3]) for r in rows) == sorted(
        (fleet, rate, policy) for fleet in ("small", "big") for rate in ("2.00", "6.00")
        for policy in ("enginegate", "round_robin")
    )  # fmt: skip
    assert {r[-3] for r in rows if r[0] == "small"} == {"16.00"} and {r[-3] for r in rows if r[0] == "big"} == {"24.00"}
    assert "small: bottleneck: model m70" in out and "big: bottleneck: model" in out
    assert "strict 429: refused in strict mode" in out  # the reasons are told
    assert "[#" not in captured.err  # not a TTY and no --progress: no bar
    written = [png, png.with_name("fleets_utilization.png")]
    assert f"plot: {written[0]}" in out and f"plot: {written[1]}" in out
    for path in written:
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 10_000


def test_policies_select_what_runs_and_unknown_ones_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = str(write_config(tmp_path / "small.yaml", SMALL))
    path = str(trace(tmp_path, 80))
    assert main(["simulate", "--config", small, "--trace", path, "--rate", "3", "--progress"]) == 0
    captured = capsys.readouterr()
    table = captured.out.split("Requests without an answer")[0]
    ran = {line.split()[2] for line in table.splitlines() if line.startswith("3.00 ")}
    assert ran == {"enginegate", "round_robin", "llm_d"}  # the default: not all thirteen
    assert "[##############################] 3/3" in captured.err  # --progress draws the bar
    assert main(["simulate", "--config", small, "--trace", path, "--rate", "3", "--policies", "llm_d"]) == 0
    table = capsys.readouterr().out.split("Requests without an answer")[0]
    assert {line.split()[2] for line in table.splitlines() if line.startswith("3.00 ")} == {"llm_d"}
    assert main(["simulate", "--config", small, "--trace", path, "--rate", "3", "--policies", "enginegate,nope"]) == 1
    err = capsys.readouterr().err
    assert "unknown policies nope" in err and "power_of_two" in err
    assert main(["simulate", "--config", small, "--trace", path, "--rate", "0"]) == 1
    assert "--rate" in capsys.readouterr().err


def test_the_bottleneck_line_names_the_backend_that_saturates_first(tmp_path: Path) -> None:
    """Half the requests for a 70B on one 4x A100 box, half for an 8B on an H100: the 70B's box saturates
    first, at twice its own rate (it gets half the traffic)."""
    fleet = sim_fleet(load_config(write_config(tmp_path / "small.yaml", SMALL)))
    rows = [TraceRow(i * 0.1, 800, 200) for i in range(400)]
    requests = build_workload(rows)
    models = assign_models(requests, [("m8", 0.5), ("m70", 0.5)], 0)
    caps = capacities(fleet, requests, models)
    assert [c.model for c in caps] == ["m70", "m8"]
    assert caps[0].fleet_rps == pytest.approx(caps[0].backends["a100x4-70b"] / caps[0].share)
    line = bottleneck(caps)
    assert line.startswith("bottleneck: model m70") and "a100x4-70b" in line and "h100-8b" not in line.split(";")[0]
    assert f"saturates at about {caps[0].fleet_rps:.2f} req/s" in line


def test_failures_are_counted_by_reason(tmp_path: Path) -> None:
    """A strict fleet refuses budgets nothing can meet (429); a model whose only backend is down has no
    backend; both counted apart, in the columns that say so."""
    strict = SMALL + "routing: {mode: strict}\n"
    fleet = sim_fleet(load_config(write_config(tmp_path / "strict.yaml", strict)), ["a100x4-70b:0:1000"])
    rows = [TraceRow(i * 0.5, 60_000, 50) for i in range(40)]
    from routing.sim.workload import parse_mix

    result = compare(
        {"strict": fleet}, rows, [("m8", 0.5), ("m70", 0.5)], rates=[2.0], mix=parse_mix("tight:1:ttft=50"),
        policies=["enginegate"],
    )  # fmt: skip
    failures = result.points[0].result.failures
    m70 = sum(1 for j in result.points[0].result.jobs if j.model == "m70")
    assert failures["no_backend"] == m70 > 0
    assert failures["strict_429"] == len(rows) - m70  # a 60k-token prompt's first token in 50 ms: never
    assert failures["shed"] == failures["lost"] == 0
    assert len(COLUMNS) == len(set(COLUMNS))


def test_an_outage_takes_down_the_backend_in_the_fleets_that_have_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small, big = str(write_config(tmp_path / "small.yaml", SMALL)), str(write_config(tmp_path / "big.yaml", BIG))
    args = ["simulate", "--config", small, "--config", big, "--trace", str(trace(tmp_path, 80)), "--rate", "2",
            "--policies", "enginegate", "--models", "m8:0.5,m70:0.5"]  # fmt: skip
    assert main([*args, "--outage", "a100x4-70b:0:1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [re.split(r" {2,}", line) for line in lines if line.startswith(("fleet ", "small ", "big "))]
    table = {row[0]: dict(zip(cells[0], row, strict=True)) for row in cells[1:]}
    assert int(table["small"]["no backend"]) > 0 and table["big"]["no backend"] == "0"
    assert main([*args, "--outage", "nowhere:0:10"]) == 1
    assert "no fleet has that backend" in capsys.readouterr().err

"""Fair comparisons in the simulator: one admission for every policy, rejected requests counted as
missed, an engine ground truth apart from the router's estimator, and the estimator's error against it."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.cli import main
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.estimator import decode_step_ms, prefill_ms
from routing.rules import Rules
from routing.sim import report
from routing.sim.calibration import PERF
from routing.sim.engine import Job, SimEngine
from routing.sim.peers import LlmD, SglangCacheAware
from routing.sim.policies import SHED_RATIO, Enginegate, LeastBusy, Policy, RoundRobin
from routing.sim.simulate import Result, SimFleet, simulate
from routing.sim.truth import EXACT, NOISE_SIGMA, SPEED_SPREAD, Truth
from routing.sim.workload import SimRequest
from routing.types import BackendProfile, BackendState, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ModelSpec("m8", 8, BYTES_PER_PARAM["bf16"], 131072, 131072)


def profile(name: str, gpu: str = "L4", max_concurrency: int = 4) -> BackendProfile:
    return BackendProfile(
        name=name, engine="vllm", models=frozenset({"m8"}), gpu=GPUS[gpu], gpu_count=1,
        memory_gb=GPUS[gpu].memory_gb, efficiency=ENGINES["vllm"], max_concurrency=max_concurrency,
    )  # fmt: skip


def overload(n: int = 300) -> list[SimRequest]:
    """Ten requests a second of 1,500-token prompts and 200-token answers: far past two small L4s."""
    return [SimRequest(i, i / 10, 1500, 200, "interactive", 2000.0, None) for i in range(n)]


def fleet(admission_s: float | None) -> SimFleet:
    return SimFleet((profile("a"), profile("b")), {"m8": LLAMA_8B}, Rules(), admission_s=admission_s)


def policies(f: SimFleet) -> list[Policy]:
    """Each with the fleet's admission only: enginegate's own shedding of hopeless requests is off."""
    return [RoundRobin(), LeastBusy(0), LlmD(), SglangCacheAware(), Enginegate(f.rules, f.models, shed_ratio=math.inf)]


def test_the_fleet_sheds_for_every_policy_alike_and_nobody_sheds_without_admission() -> None:
    requests = overload()
    admitting = fleet(admission_s=3.0)
    for policy in policies(admitting):
        result = simulate(admitting, requests, ["m8"] * len(requests), policy)
        shed = [j for j in result.jobs if j.failure == "shed"]
        assert len(shed) > len(requests) // 4, policy.name  # a peer's requests are shed as enginegate's are
        assert all(j.rejected and j.first_token_s is None and not j.within_budget for j in shed)
        assert result.rejected == len(shed) and result.unanswered == len(shed)
        answered = [j for j in result.jobs if j.first_token_s is not None]
        # Shed only after queueing past the limit: the first-come are answered, none waited > 3 s to start.
        assert answered and all(j.done_s is not None for j in answered)
    open_door = fleet(admission_s=None)
    for policy in policies(open_door):
        result = simulate(open_door, requests, ["m8"] * len(requests), policy)
        assert result.rejected == 0 and result.unanswered == 0, policy.name


def test_enginegate_does_not_shed_on_its_own_queue_prediction_in_the_simulator() -> None:
    # Its predictive admission (max_queue_wait_ms) would shed here; in the simulator admission is the fleet's.
    f = replace(fleet(admission_s=None), rules=Rules(max_queue_wait_ms=1.0))
    requests = overload(200)
    result = simulate(f, requests, ["m8"] * len(requests), Enginegate(f.rules, f.models, shed_ratio=math.inf))
    assert result.rejected == 0 and all(j.done_s is not None for j in result.jobs)


def test_enginegate_sheds_what_it_predicts_hopeless_and_that_is_counted_as_missed() -> None:
    # Far past two L4s: served, the hopeless requests only make the rest late; shed, they are missed
    # (503s in the table) and the capacity they free lets more of the others meet their budgets.
    f = fleet(admission_s=None)
    requests = overload(200)
    served = simulate(f, requests, ["m8"] * len(requests), Enginegate(f.rules, f.models, shed_ratio=math.inf))
    shedding = simulate(f, requests, ["m8"] * len(requests), Enginegate(f.rules, f.models, shed_ratio=SHED_RATIO))
    shed = [j for j in shedding.jobs if j.failure == "hopeless"]
    assert shed and shedding.rejected == len(shed) and not any(j.within_budget for j in shed)
    met = sum(j.within_budget for j in shedding.jobs)
    assert met > sum(j.within_budget for j in served.jobs)
    assert shedding.attainment == pytest.approx(met / len(requests))  # the shed count in the denominator


def _job(i: int, ttft_s: float | None) -> Job:
    job = Job(SimRequest(i, 0.0, 100, 10, "interactive", 500.0, None), "m8")
    if ttft_s is None:
        job.rejected, job.failure = True, "shed"
    else:
        job.first_token_s, job.done_s = ttft_s, ttft_s + 0.1
    return job


def test_rejected_requests_count_as_missed_and_as_never_answered_in_the_percentiles() -> None:
    jobs = (*(_job(i, 0.1) for i in range(98)), _job(98, None), _job(99, None))
    result = Result("p", jobs, 10.0, {"a": 1.0}, {"a": 1.0})
    assert result.attainment == pytest.approx(0.98)
    assert result.percentile("ttft", 0.99) == pytest.approx(0.1)  # answered only: the rejected vanish
    assert result.percentile("ttft", 0.99, unanswered=True) == math.inf
    assert result.percentile("ttft", 0.97, unanswered=True) == pytest.approx(0.1)
    row = dict(zip(report.COLUMNS, report.row(report.Point(1.0, result, 1.0)), strict=True))
    assert row["rejected"] == "2" and row["shed (503)"] == "2"
    assert row["TTFT p99 ms"] == "never" and row["e2e p99 s"] == "never" and row["TTFT p50 ms"] == "100"
    assert row["within budget %"] == "98.0"


def _state(p: BackendProfile, running: int) -> BackendState:
    return BackendState(profile=p, running=running, waiting=0)


def test_the_ground_truth_is_seeded_noisy_and_not_the_estimator() -> None:
    perf = PERF["vllm"]
    a, b = profile("a", "H100", 256), profile("b", "H100", 256)
    clock = Truth(seed=1).clock(perf, a, LLAMA_8B)
    again = Truth(seed=1).clock(perf, a, LLAMA_8B)
    draws = [clock.step_ms(64, 64 * 1500, 0) for _ in range(2000)]
    assert draws == [again.step_ms(64, 64 * 1500, 0) for _ in range(2000)]  # deterministic per seed
    assert draws != [Truth(seed=2).clock(perf, a, LLAMA_8B).step_ms(64, 64 * 1500, 0) for _ in range(2000)]
    logs = [math.log(d) for d in draws]
    assert statistics.stdev(logs) == pytest.approx(NOISE_SIGMA, rel=0.1)  # noise present, as documented
    assert statistics.fmean(draws) == pytest.approx(clock.mean_ms(64, 64 * 1500, 0), rel=0.01)
    speeds = {Truth(seed=s).clock(perf, p, LLAMA_8B).speed for s in range(20) for p in (a, b)}
    assert len(speeds) == 40 and all(abs(s - 1) <= SPEED_SPREAD for s in speeds)
    assert max(speeds) - min(speeds) > SPEED_SPREAD  # instances of one kind really differ
    exact = EXACT.clock(perf, a, LLAMA_8B)
    assert [exact.step_ms(64, 64 * 1500, 0) for _ in range(3)] == [exact.mean_ms(64, 64 * 1500, 0)] * 3
    plain = Truth(seed=1, speed_spread=0.0, noise_sigma=0.0).clock(perf, a, LLAMA_8B)
    # Interference: a mixed step costs more than the physics of its tokens (one weight read for both).
    calm = Truth(seed=1, speed_spread=0.0, noise_sigma=0.0, interference=0.0).clock(perf, a, LLAMA_8B)
    assert plain.mean_ms(64, 64 * 1500, 512) > 1.05 * calm.mean_ms(64, 64 * 1500, 512)
    assert plain.mean_ms(64, 64 * 1500, 0) == calm.mean_ms(64, 64 * 1500, 0)
    # Not the estimator: its decode step and prefill differ from the truth's by more than noise.
    decode = decode_step_ms(LLAMA_8B, _state(a, 63), 1500)
    prefill = prefill_ms(LLAMA_8B, _state(a, 0), 512)
    assert abs(plain.mean_ms(64, 64 * 1500, 0) / decode - 1) > 0.2
    assert abs(plain.mean_ms(0, 0, 512) / prefill - 1) > 0.2


def test_the_estimators_error_is_measured_for_every_request_the_router_placed() -> None:
    requests = [SimRequest(i, i / 2, 1000, 100, "interactive", 2000.0, None) for i in range(120)]
    f = SimFleet((profile("a"), profile("b")), {"m8": LLAMA_8B}, Rules())
    ours = simulate(f, requests, ["m8"] * 120, Enginegate(f.rules, f.models, shed_ratio=math.inf))
    theirs = simulate(f, requests, ["m8"] * 120, RoundRobin())
    ttft = ours.prediction_errors("ttft")
    assert len(ttft) == sum(j.first_token_s is not None for j in ours.jobs) == 120
    assert len(ours.prediction_errors("e2e")) == len(ours.prediction_errors("e2e_known")) == 120
    assert all(e >= 0 for e in ttft) and statistics.median(ttft) > 0  # the truth is not its model
    assert theirs.prediction_errors("ttft") == []  # round robin predicts nothing
    table = report.errors([report.Point(0.5, ours, 2.0), report.Point(0.5, theirs, 2.0)])
    lines = table.splitlines()
    assert len(lines) == 3 and "| enginegate | 120 |" in lines[2]
    # The error is what it says: |predicted - actual| / actual.
    job = _job(0, 0.1)
    job.predicted_ttft_ms, job.predicted_tpot_ms, job.predicted_e2e_ms = 150.0, 10.0, 400.0
    one = Result("p", (job,), 1.0, {}, {})
    assert one.prediction_errors("ttft") == [pytest.approx(0.5)]
    assert one.prediction_errors("e2e") == [pytest.approx(1.0)]  # actual e2e 200 ms
    assert one.prediction_errors("e2e_known") == [pytest.approx(0.2)]  # 150 + 10 x 9 = 240


def _shed_by_policy(out: str) -> dict[str, int]:
    """The ``shed (503)`` cell of each row of ``enginegate simulate``'s table, by policy."""
    head, *rows = out.split("\n\n")[1].splitlines()  # after the capacity lines: the table, its head first
    starts = [head.index(c) for c in ("policy", "shed (503)")]
    return {row[starts[0] :].split()[0]: int(row[starts[1] :].split()[0]) for row in rows}


def test_cli_simulate_applies_one_admission_to_every_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.05},1500,200\n" for i in range(600)))
    base = [
        "simulate", "--config", str(ROOT / "configs/sim-fleet.yaml"), "--trace", str(trace), "--load", "400",
        "--models", "llama-3.1-8b:1", "--policies", "round_robin,llm_d,enginegate",
    ]  # fmt: skip
    assert main([*base, "--admission", "1"]) == 0
    shed = _shed_by_policy(capsys.readouterr().out)
    assert set(shed) == {"round_robin", "llm_d", "enginegate"} and all(n > 0 for n in shed.values()), shed
    assert main([*base, "--admission", "none"]) == 0
    # Without admission no peer sheds; enginegate sheds only what it predicts hopeless (its SHED_RATIO).
    shed = _shed_by_policy(capsys.readouterr().out)
    assert shed["round_robin"] == shed["llm_d"] == 0, shed
    assert main([*base, "--admission", "soon"]) == 1
    assert "--admission 'soon'" in capsys.readouterr().err


def test_a_prompt_holding_a_slot_without_a_prefill_chunk_is_still_queued_and_is_shed() -> None:
    # With 256 slots nothing waits in the engine's queue, yet 60 long prompts at once are prefilled a
    # chunk per step: those not started within the limit are shed (vLLM still has them waiting).
    engine = SimEngine(profile("a", "L4", 256), LLAMA_8B, max_wait_s=1.0)
    jobs = [Job(SimRequest(i, 0.0, 4000, 20, "interactive", 500.0, None), "m8") for i in range(60)]
    for job in jobs:
        engine.submit(job, 0.0)
    now, shed = 0.0, []
    while (duration := engine.start_step(now)) is not None:
        shed += engine.shed
        engine.shed.clear()
        now += duration
        engine.end_step(now, duration)
    assert 0 < len(shed) < 60 and all(j.failure == "shed" and j.first_token_s is None for j in shed)
    assert all(j.done_s is not None for j in jobs if j not in shed)
    assert engine.running == 0 and engine.kv_usage == 0.0  # the shed gave their KV reservation back
    assert sorted(j.request.id for j in shed) == list(range(60 - len(shed), 60))  # the last come, first shed

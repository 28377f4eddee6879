"""The fleet simulator: the engine model, the event loop, the baselines, and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.rules import Rules
from routing.sim.calibration import PERF, step_ms
from routing.sim.engine import Job, SimEngine
from routing.sim.policies import (
    BackendView,
    Enginegate,
    LeastBusy,
    LowestLatency,
    RoundRobin,
    StaticTable,
)
from routing.sim.simulate import Outage, SimFleet, assign_models, capacity_rps, simulate
from routing.sim.sweep import parse_shares, sweep
from routing.sim.traces import TraceRow
from routing.sim.truth import EXACT
from routing.sim.workload import SimRequest
from routing.types import BackendProfile, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ModelSpec("m8", 8, BYTES_PER_PARAM["bf16"], 131072, 131072)
LLAMA_70B = ModelSpec("m70", 70, BYTES_PER_PARAM["bf16"], 131072, 327680)


def profile(name: str, engine: str, gpu: str, count: int = 1, model: str = "m8", **kw: object) -> BackendProfile:
    return BackendProfile(
        name=name,
        engine=engine,
        models=frozenset({model}),
        gpu=GPUS[gpu],
        gpu_count=count,
        memory_gb=float(kw.pop("memory_gb", GPUS[gpu].memory_gb * count)),  # type: ignore[arg-type]
        efficiency=ENGINES[engine],
        max_concurrency=int(kw.pop("max_concurrency", 256)),  # type: ignore[call-overload]
        cost_per_hour=float(kw.pop("cost_per_hour", 1.0)),  # type: ignore[arg-type]
    )


def request(i: int, at: float, prompt: int = 1000, out: int = 100, ttft: float | None = 500.0) -> SimRequest:
    return SimRequest(i, at, prompt, out, "interactive", ttft, None)


def test_a_lone_request_takes_one_prefill_step_then_a_step_per_token() -> None:
    engine = SimEngine(profile("a", "vllm", "A100-80GB"), LLAMA_8B)
    job = Job(request(0, 0.0, prompt=1000, out=3), "m8")
    engine.submit(job)
    now = 0.0
    while (duration := engine.start_step()) is not None:
        now += duration
        engine.end_step(now, duration)
    perf, gpu = PERF["vllm"], GPUS["A100-80GB"]
    prefill = step_ms(perf, gpu, 1, 8, 2, 131072, 0, 0, 1000) / 1000
    decode = [step_ms(perf, gpu, 1, 8, 2, 131072, 1, ctx, 0) / 1000 for ctx in (1001, 1002)]
    assert job.first_token_s == pytest.approx(prefill)
    assert job.done_s == pytest.approx(prefill + sum(decode))
    assert engine.busy_s == pytest.approx(job.done_s)


def test_requests_wait_for_kv_cache_room() -> None:
    # 8B on an L4: about 42,700 tokens of KV cache, so two 23,000-token requests cannot run together
    engine = SimEngine(profile("l4", "tgi", "L4"), LLAMA_8B)
    assert 40_000 < engine.kv_tokens < 45_000
    first, second = Job(request(0, 0.0, 22_000, 1000), "m8"), Job(request(1, 0.0, 22_000, 1000), "m8")
    engine.submit(first)
    engine.submit(second)
    engine.start_step()
    assert engine.running == 1 and list(engine.waiting) == [second]
    assert not engine.fits(Job(request(2, 0.0, 50_000, 10), "m8"))


def test_round_robin_cycles_and_least_busy_picks_the_emptiest() -> None:
    views = [BackendView(SimEngine(profile(n, "vllm", "A100-80GB"), LLAMA_8B)) for n in "abc"]
    job = Job(request(0, 0.0), "m8")
    rr = RoundRobin()
    assert [rr.pick(job, views).name for _ in range(4)] == ["b", "c", "a", "b"]
    views[0].in_flight, views[1].in_flight, views[2].in_flight = 3, 1, 2
    assert LeastBusy(0).pick(job, views).name == "b"


def test_latency_routing_tries_untried_backends_then_the_fastest_on_record() -> None:
    views = [BackendView(SimEngine(profile(n, "vllm", "A100-80GB"), LLAMA_8B)) for n in "ab"]
    policy = LowestLatency(0)
    done = Job(request(0, 0.0, out=10), "m8", first_token_s=0.5, done_s=1.0)
    policy.finished(done, views[0])
    assert policy.pick(Job(request(1, 1.0), "m8"), views).name == "b"  # untried: 0
    policy.finished(Job(request(2, 0.0, out=10), "m8", first_token_s=2.0, done_s=3.0), views[1])
    assert policy.pick(Job(request(3, 3.0), "m8"), views).name == "a"


def test_static_table_follows_the_usual_decision_tree() -> None:
    trt = BackendView(SimEngine(profile("trt", "trtllm_serve", "H100", cost_per_hour=6), LLAMA_8B))
    vllm = BackendView(SimEngine(profile("vllm", "vllm", "A100-80GB", cost_per_hour=3), LLAMA_8B))
    cpu = BackendView(SimEngine(profile("cpu", "llama_server", "CPU", memory_gb=64, cost_per_hour=0.2), LLAMA_8B))
    views = [trt, vllm, cpu]
    table = StaticTable()
    assert table.pick(Job(request(0, 0.0, ttft=200), "m8"), views) is trt
    assert table.pick(Job(request(1, 0.0, ttft=3000), "m8"), views) is vllm
    batch = SimRequest(2, 0.0, 100, 10, "batch", None, 600_000)
    assert table.pick(Job(batch, "m8"), views) is cpu
    assert table.pick(Job(request(3, 0.0, ttft=200), "m8"), [vllm, cpu]) in (vllm, cpu)  # no TensorRT-LLM: anything


def mixed_fleet(**kw: object) -> SimFleet:
    return SimFleet(
        profiles=(
            profile("fast", "trtllm_serve", "H100", cost_per_hour=6),
            profile("slow", "tgi", "L4", cost_per_hour=0.8),
        ),
        models={"m8": LLAMA_8B},
        **kw,  # type: ignore[arg-type]
    )


def burst(n: int, rate: float) -> list[SimRequest]:
    return [request(i, i / rate, prompt=800 + (i * 37) % 900, out=50 + (i * 13) % 150) for i in range(n)]


def test_the_default_policy_meets_more_budgets_than_round_robin_on_a_mixed_fleet() -> None:
    fleet = mixed_fleet()
    requests = burst(600, 8.0)
    models = ["m8"] * len(requests)
    ours = simulate(fleet, requests, models, Enginegate(Rules(), fleet.models))
    theirs = simulate(fleet, requests, models, RoundRobin())
    assert ours.attainment > theirs.attainment + 0.1
    assert sum(j.backend == "fast" for j in ours.jobs) > sum(j.backend == "fast" for j in theirs.jobs)


def test_simulation_is_deterministic() -> None:
    fleet = mixed_fleet()
    requests = burst(300, 6.0)
    one = simulate(fleet, requests, ["m8"] * 300, LeastBusy(7))
    two = simulate(fleet, requests, ["m8"] * 300, LeastBusy(7))
    assert [(j.backend, j.first_token_s, j.done_s) for j in one.jobs] == [
        (j.backend, j.first_token_s, j.done_s) for j in two.jobs
    ]


def test_an_outage_reroutes_requests_without_a_first_token_and_fails_the_others() -> None:
    requests = burst(400, 8.0)
    calm = simulate(mixed_fleet(), requests, ["m8"] * 400, RoundRobin())
    # the L4 cannot keep up with half of 8 requests/s: when it fails, it holds queued and streaming requests
    hit = simulate(mixed_fleet(outages=(Outage("slow", 10.0, 30.0),)), requests, ["m8"] * 400, RoundRobin())
    assert calm.failed == 0 and hit.failed > 0
    rerouted = [j for j in hit.jobs if j.attempts == 2]
    assert rerouted and all(j.backend == "fast" and j.done_s is not None for j in rerouted)
    during = [j for j in hit.jobs if 10.0 <= j.request.arrival_s < 30.0]
    assert all(j.backend == "fast" for j in during)
    assert all(j.first_token_s is not None and j.done_s is None for j in hit.jobs if j.failed)


def test_capacity_grows_with_the_fleet_and_load_one_is_that_rate() -> None:
    # The physics alone: with hidden per-instance speeds two backends are not twice one.
    small = SimFleet((profile("a", "vllm", "A100-80GB"),), {"m8": LLAMA_8B}, truth=EXACT)
    big = SimFleet(
        (profile("a", "vllm", "A100-80GB"), profile("b", "vllm", "A100-80GB")), {"m8": LLAMA_8B}, truth=EXACT
    )
    requests = burst(100, 1.0)
    one, two = capacity_rps(small, requests, ["m8"] * 100), capacity_rps(big, requests, ["m8"] * 100)
    assert two == pytest.approx(2 * one)
    rows = [TraceRow(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in burst(200, 1.0)]
    capacity, points = sweep(small, rows, [1.0], [("m8", 1.0)], policies=lambda: [RoundRobin()])
    assert capacity == pytest.approx(one, rel=0.05)
    arrivals = [j.request.arrival_s for j in points[0].result.jobs]
    assert (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) == pytest.approx(capacity, rel=0.01)


def test_models_are_assigned_by_share_and_shares_are_checked() -> None:
    requests = burst(4000, 10.0)
    models = assign_models(requests, [("m8", 0.8), ("m70", 0.2)], seed=1)
    assert models.count("m70") / len(models) == pytest.approx(0.2, abs=0.02)
    assert parse_shares("a:3,b:1") == [("a", 0.75), ("b", 0.25)]
    with pytest.raises(ValueError, match="expected name:share"):
        parse_shares("a")


def test_cli_simulate_prints_the_comparison_and_writes_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i * 0.5},{500 + i % 700},{20 + i % 90}\n" for i in range(400))
    )
    png = tmp_path / "out.png"
    code = main(
        [
            "simulate", "--config", str(ROOT / "configs/sim-fleet.yaml"), "--trace", str(trace),
            "--load", "50,100", "--models", "llama-3.1-8b:0.8,llama-3.1-70b:0.2", "--plot", str(png),
            "--policies", "round_robin,random,least_busy,latency,static,enginegate",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    comparison, rest = out.split("Busy share of each backend")
    utilization, errors = rest.split("The router's predictions against the simulated engines")
    for policy in ("round_robin", "random", "least_busy", "latency", "static", "enginegate"):
        assert comparison.count(f" {policy} ") == 2, policy
        assert utilization.count(f" {policy} ") == 2, policy
    assert " enginegate | " in utilization and "trt-h100" in utilization  # the utilization table, per backend
    assert errors.count("| enginegate |") == 2 and "| round_robin |" not in errors  # only enginegate predicts
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_simulate_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(ROOT / "configs/sim-fleet.yaml")
    trace = str(ROOT / "data/traces/AzureLLMInferenceTrace_code.csv")
    assert main(["simulate", "--config", config, "--trace", trace, "--models", "nope:1"]) == 1
    assert "models not in the fleet: nope" in capsys.readouterr().err
    assert main(["simulate", "--config", config, "--trace", trace, "--outage", "trt-h100:9"]) == 1
    assert "--outage" in capsys.readouterr().err
    assert main(["simulate", "--config", config, "--trace", str(tmp_path / "missing.csv")]) == 1


def test_cached_prompt_tokens_are_not_prefilled_but_every_decode_step_still_reads_them() -> None:
    # Capacity with 80% of a long prompt cached sat at that of a prompt a fifth as long: the decode
    # steps' context shrank with the prefill, and "80% load" on a prefix-heavy workload was saturation.
    fleet = SimFleet((profile("a", "vllm", "H100", max_concurrency=8),), {"m8": LLAMA_8B})  # slots, not KV, bind
    long = [SimRequest(i, i * 0.01, 5000, 200, "batch", None, None) for i in range(50)]
    short = [SimRequest(i, i * 0.01, 1000, 200, "batch", None, None) for i in range(50)]
    cached = capacity_rps(fleet, long, ["m8"] * 50, prefill_share=0.2)
    assert cached > capacity_rps(fleet, long, ["m8"] * 50)  # less prefill: more requests
    assert cached < 0.95 * capacity_rps(fleet, short, ["m8"] * 50)  # but not those of short prompts

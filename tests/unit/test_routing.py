"""choose() on hand-built snapshots: the usual engine choices emerge from the estimates.

No engine name appears in the policy; the fleets below give each engine its usual
hardware (TensorRT-LLM on H100, vLLM on A100, TGI on L4, llama.cpp on CPU) and the
choices follow from prefill FLOP/s, decode bandwidth, memory, load and cost.
"""

from __future__ import annotations

import random
from dataclasses import fields, replace

import pytest

from routing import load
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.decisions import Reason
from routing.estimator import observe, predict, slots
from routing.features import InvalidHeader, features
from routing.policy import choose
from routing.rules import Mode, Rule, Rules
from routing.types import BackendProfile, BackendState, Breaker, FleetSnapshot, ModelSpec, Observed, RequestFeatures

LLAMA_8B = ModelSpec("llama-8b", 8, BYTES_PER_PARAM["bf16"], 8192, 131072)
LLAMA_70B = ModelSpec("llama-70b", 70, BYTES_PER_PARAM["bf16"], 8192, 327680)


def backend(
    name: str, engine: str, gpu: str, count: int = 1, models: tuple[str, ...] = ("llama-8b",), **kw: object
) -> BackendState:
    spec = GPUS[gpu]
    memory = float(kw.pop("memory_gb", spec.memory_gb * count))  # type: ignore[arg-type]
    profile = BackendProfile(
        name=name,
        engine=engine,
        models=frozenset(models),
        gpu=spec,
        gpu_count=count,
        memory_gb=memory,
        efficiency=ENGINES[engine],
        max_concurrency=int(kw.pop("max_concurrency", 64)),  # type: ignore[call-overload]
        cost_per_hour=float(kw.pop("cost_per_hour", 0.0)),  # type: ignore[arg-type]
        pool=kw.pop("pool", None),  # type: ignore[arg-type]
    )
    return BackendState(profile, **kw)  # type: ignore[arg-type]


FLEET = (
    backend("trt-h100", "trtllm_serve", "H100", cost_per_hour=6.0),
    backend("vllm-a100", "vllm", "A100-80GB", cost_per_hour=3.0),
    backend("tgi-l4", "tgi", "L4", cost_per_hour=0.8),
    backend("llamacpp-cpu", "llama_server", "CPU", memory_gb=64, cost_per_hour=0.2),
)


def snap(*states: BackendState) -> FleetSnapshot:
    return FleetSnapshot(states, {"llama-8b": LLAMA_8B, "llama-70b": LLAMA_70B})


def ask(model: str = "llama-8b", prompt: int = 1000, out: int = 200, **kw: object) -> RequestFeatures:
    return RequestFeatures(model=model, prompt_tokens=prompt, max_tokens=out, **kw)  # type: ignore[arg-type]


def test_tight_first_token_budget_goes_to_the_h100_running_tensorrt_llm() -> None:
    decision = choose(ask(ttft_budget_ms=50), snap(*FLEET), Rules())
    assert decision.reason is Reason.MEETS_BUDGET
    assert decision.candidates[0].backend == "trt-h100"
    assert [c.meets_budget for c in decision.candidates] == [True, False, False, False]


def test_relaxed_budget_goes_where_its_work_costs_least_among_backends_that_meet_it() -> None:
    # Met safely on both GPUs, the price of the request's GPU time decides: the H100 at $6/h finishes
    # it for less than the A100 at $3/h (its lead was the home bonus, not the price, before).
    relaxed = ask(ttft_budget_ms=2000, latency_budget_ms=20000)
    decision = choose(relaxed, snap(*FLEET), Rules())
    assert decision.reason is Reason.MEETS_BUDGET
    lead = decision.candidates[0]
    assert lead.meets_budget
    assert lead.terms["cost"] == max(c.terms["cost"] for c in decision.candidates if c.meets_budget)
    cheap = replace(FLEET[1], profile=replace(FLEET[1].profile, cost_per_hour=1.0))
    assert choose(relaxed, snap(FLEET[0], cheap, *FLEET[2:]), Rules()).candidates[0].backend == "vllm-a100"


def test_seventy_billion_parameters_only_where_the_gpus_hold_them() -> None:
    big = (
        backend("vllm-4xa100", "vllm", "A100-80GB", 4, models=("llama-70b",)),
        backend("vllm-1xa100", "vllm", "A100-80GB", 1, models=("llama-70b",)),
        backend("tgi-2xl4", "tgi", "L4", 2, models=("llama-70b",)),
    )
    decision = choose(ask("llama-70b"), snap(*big), Rules())
    assert [c.backend for c in decision.candidates] == ["vllm-4xa100"]
    assert "GB" in decision.excluded["vllm-1xa100"] and "GB" in decision.excluded["tgi-2xl4"]


def test_nothing_holds_the_model_is_its_own_reason() -> None:
    decision = choose(ask("llama-70b"), snap(backend("l4", "tgi", "L4", models=("llama-70b",))), Rules())
    assert decision.reason is Reason.NOTHING_FITS and not decision.candidates


def test_without_gpus_requests_go_to_the_cpu_engines() -> None:
    gpus_down = [replace(b, healthy=False) for b in FLEET[:3]]
    cpu = backend("ct2-cpu", "ctranslate2", "CPU", memory_gb=32)
    decision = choose(ask(prompt=100, out=50), snap(*gpus_down, FLEET[3], cpu), Rules())
    assert {c.backend for c in decision.candidates} == {"llamacpp-cpu", "ct2-cpu"}
    assert decision.excluded == {"trt-h100": "unhealthy", "vllm-a100": "unhealthy", "tgi-l4": "unhealthy"}


def test_a_loaded_backend_loses_traffic_to_an_idle_one() -> None:
    twins = [backend(f"vllm-{i}", "vllm", "A100-80GB", max_concurrency=8) for i in range(2)]
    assert choose(ask(ttft_budget_ms=500), snap(*twins), Rules()).candidates[0].backend in {"vllm-0", "vllm-1"}
    busy = replace(twins[0], running=8, waiting=20)
    decision = choose(ask(ttft_budget_ms=500), snap(busy, twins[1]), Rules())
    assert decision.candidates[0].backend == "vllm-1"
    assert decision.candidates[1].prediction.queue_ms > 0


def test_a_recovering_backend_gets_a_share_of_requests_even_when_they_are_identical() -> None:
    """The gate is drawn per request: a thousand copies of one prompt get the share too (a gate
    hashed from the prompt admitted none of them, issue 11.3)."""
    twins = [backend(f"b{i}", "vllm", "A100-80GB") for i in range(2)]
    rng = random.Random(7)
    shares = []
    for recovery in (0.1, 0.5, 1.0):
        recovering = replace(twins[0], breaker=Breaker.HALF_OPEN, recovery=recovery)
        hits = sum(
            any(
                c.backend == "b0" and not c.terms["last_resort"]
                for c in choose(ask(gate=rng.random()), snap(recovering, twins[1]), Rules()).candidates
            )
            for _ in range(1000)
        )
        shares.append(hits / 1000)
    assert shares[0] == pytest.approx(0.1, abs=0.04)
    assert shares[1] == pytest.approx(0.5, abs=0.06)
    assert shares[2] == 1.0


def test_a_recovering_backend_that_passed_on_a_request_is_its_last_resort() -> None:
    """Tried only when every other candidate failed: better than a 502 (found by an outside audit)."""
    recovering = replace(backend("b0", "vllm", "A100-80GB"), breaker=Breaker.HALF_OPEN, recovery=0.1)
    decision = choose(ask(gate=0.99), snap(recovering, backend("b1", "vllm", "A100-80GB")), Rules())
    assert [c.backend for c in decision.candidates] == ["b1", "b0"]
    assert decision.candidates[1].terms["last_resort"] == 1.0


def test_a_lone_recovering_backend_takes_every_request_as_its_probe() -> None:
    lone = replace(backend("b0", "vllm", "A100-80GB"), breaker=Breaker.HALF_OPEN, recovery=0.1)
    decision = choose(ask(gate=0.99), snap(lone), Rules())
    assert [c.backend for c in decision.candidates] == ["b0"] and decision.excluded == {}


def test_an_engine_that_reports_a_queue_is_predicted_to_queue() -> None:
    """An engine capped below its configured concurrency (2 running, 8 waiting) queues the next request
    (issue 11.2: predicted 243 ms, real 10 s); an idle twin wins a tight budget."""
    queued = replace(backend("q", "vllm", "A100-80GB"), running=2, waiting=8, engine_slots=2)
    idle = backend("idle", "vllm", "A100-80GB")
    decision = choose(ask(ttft_budget_ms=500), snap(queued, idle), Rules())
    by_name = {c.backend: c for c in decision.candidates}
    assert by_name["q"].prediction.queue_ms > 0 and by_name["idle"].prediction.queue_ms == 0
    assert decision.candidates[0].backend == "idle"


def test_an_open_breaker_excludes_its_backend() -> None:
    twins = [backend(f"b{i}", "vllm", "A100-80GB") for i in range(2)]
    assert choose(ask(), snap(replace(twins[0], breaker=Breaker.OPEN), twins[1]), Rules()).excluded == {
        "b0": "circuit breaker open"
    }


def test_observed_latency_replaces_the_prior() -> None:
    fast, slow = backend("a", "vllm", "A100-80GB"), backend("b", "vllm", "A100-80GB")
    prior = predict(LLAMA_8B, slow, 1000, 200).ttft_ms
    learned = Observed()
    for _ in range(10):  # each request was predicted with what had been learned so far, and took 10x the prior
        predicted = predict(LLAMA_8B, replace(slow, observed=learned), 1000, 200).prior_ttft_ms
        learned = observe(learned, predicted, prior * 10, None)
    slow = replace(slow, observed=learned)
    assert predict(LLAMA_8B, slow, 1000, 200).ttft_ms == pytest.approx(prior * 10, rel=0.05)
    assert choose(ask(ttft_budget_ms=prior * 3), snap(slow, fast), Rules()).candidates[0].backend == "a"


def test_no_backend_can_meet_a_strict_budget_is_rejected_with_retry_after() -> None:
    rules = Rules(rules=(Rule("interactive", ttft_budget_ms=(None, 100), mode=Mode.STRICT),))
    decision = choose(ask(ttft_budget_ms=1), snap(*FLEET), rules)
    assert decision.reason is Reason.BUDGET_UNMEETABLE and decision.rule == "interactive"
    assert decision.retry_after_s is not None and decision.retry_after_s >= 1
    near = min(predict(LLAMA_8B, s, 1000, 200).ttft_ms for s in FLEET) * 0.8
    best_effort = choose(ask(ttft_budget_ms=near), snap(*FLEET), Rules())
    assert best_effort.reason is Reason.BEST_EFFORT
    assert best_effort.candidates[0].backend == "trt-h100"  # a near miss: the closest to the budget leads


def test_rules_prefer_avoid_require_and_defaults() -> None:
    fleet = snap(
        *[replace(b, profile=replace(b.profile, pool="gpu" if b.profile.gpu.name != "CPU" else "cpu")) for b in FLEET]
    )
    prefer = Rules(rules=(Rule("cheap-first", prefer=("cpu",)),))
    assert choose(ask(), fleet, prefer).candidates[0].backend == "llamacpp-cpu"
    avoid = Rules(rules=(Rule("no-trt", avoid=("trt-h100",)),))
    assert choose(ask(), fleet, avoid).candidates[-1].backend == "trt-h100"
    require = Rules(rules=(Rule("gpu-only", models=("llama-*",), require=("gpu",), max_attempts=2),))
    decision = choose(ask(), fleet, require)
    assert "llamacpp-cpu" in decision.excluded and decision.max_attempts == 2 and decision.rule == "gpu-only"
    defaults = Rules(rules=(Rule("tenant-a", tenants=("a",), default_ttft_budget_ms=50),))
    assert choose(ask(tenant="a"), fleet, defaults).reason is Reason.MEETS_BUDGET
    assert choose(ask(tenant="b"), fleet, defaults).reason is Reason.NO_BUDGET


def test_prefix_affinity_keeps_a_prefix_on_one_of_equal_backends() -> None:
    twins = snap(*[backend(f"b{i}", "vllm", "A100-80GB") for i in range(4)])
    firsts = {choose(ask(prefix_hash=1234), twins, Rules()).candidates[0].backend for _ in range(5)}
    assert len(firsts) == 1
    spread = {choose(ask(prefix_hash=h), twins, Rules()).candidates[0].backend for h in range(40)}
    assert len(spread) == 4


def test_model_nobody_serves() -> None:
    assert choose(ask("gpt-9"), snap(*FLEET), Rules()).reason is Reason.NO_BACKEND_FOR_MODEL


def test_budget_headers() -> None:
    f = features("m", ["abcdefgh"], 5, True, {"x-slo-ttft-ms": "250", "x-latency-budget-ms": "2000", "x-tenant": "t"})
    assert (f.ttft_budget_ms, f.latency_budget_ms, f.prompt_tokens, f.tenant) == (250.0, 2000.0, 3, "t")
    assert f.prefix_hash == features("m", ["abcdefgh"], 5, True, {}).prefix_hash
    for bad in ("soon", "-5", "inf", "nan"):
        with pytest.raises(InvalidHeader):
            features("m", [], None, False, {"x-ttft-budget-ms": bad})


def test_prompts_queued_for_prefill_delay_the_first_token() -> None:
    idle = backend("a", "vllm", "A100-80GB")
    behind = replace(backend("b", "vllm", "A100-80GB"), prefill_backlog_tokens=40_000)
    assert predict(LLAMA_8B, behind, 1000, 200).ttft_ms > 10 * predict(LLAMA_8B, idle, 1000, 200).ttft_ms
    # the backlog alone decides between twins: a tight request goes where no prompts wait
    assert choose(ask(ttft_budget_ms=500), snap(behind, idle), Rules()).candidates[0].backend == "a"


def test_a_full_kv_cache_queues_requests_before_the_slot_limit() -> None:
    # 8B on an L4 leaves about 5.6 GB of KV cache: some 35 sequences of 1200 tokens, far fewer than 256 slots
    l4 = backend("l4", "tgi", "L4", max_concurrency=256)
    assert slots(LLAMA_8B, l4, 1200) < 40
    assert predict(LLAMA_8B, replace(l4, running=30), 1000, 200).queue_ms == 0
    assert predict(LLAMA_8B, replace(l4, running=60), 1000, 200).queue_ms > 0


def test_observations_are_compared_with_the_uncorrected_prior() -> None:
    """Requests in flight were predicted with older corrections: each is measured against its own prior."""
    state = backend("a", "vllm", "A100-80GB")
    first = predict(LLAMA_8B, state, 1000, 200)
    learned = observe(Observed(), first.prior_ttft_ms, first.prior_ttft_ms * 2, None)
    assert learned.ttft_ratio == pytest.approx(2)
    # a second request predicted before the first finished took 2x its prior too: the ratio stays at 2
    learned = observe(learned, first.prior_ttft_ms, first.prior_ttft_ms * 2, None)
    assert learned.ttft_ratio == pytest.approx(2)
    corrected = predict(LLAMA_8B, replace(state, observed=learned), 1000, 200)
    assert corrected.prior_ttft_ms == pytest.approx(first.prior_ttft_ms)
    assert corrected.ttft_ms == pytest.approx(2 * first.prior_ttft_ms)


def test_observe_writes_every_field_of_what_it_learned() -> None:
    """observe() builds its result field by field (not dataclasses.replace, an interpreted call per
    request): a field added to Observed must be written there too, or it would be reset each time."""
    assert [f.name for f in fields(Observed)] == ["ttft_ratio", "tpot_ms", "samples", "out_tokens"]
    learned = observe(Observed(2.0, 10.0, 5, 40.0), 100.0, 100.0, 20.0, 80)
    assert learned == Observed(1.8, 12.0, 6, 48.0)


def test_engine_load_is_moved_by_the_gateways_own_requests_since_the_poll() -> None:
    # the engine said 10 running at the poll, when 4 of ours were in flight; now 9 of ours are
    assert load.current(10, 0, 4, 9, 64) == (15, 0)
    # never below our own count (the engine cannot run fewer of ours than we have in flight)
    assert load.current(2, 0, 8, 3, 64) == (3, 0)
    # beyond the engine's slots the rest waits
    assert load.current(60, 5, 0, 10, 64) == (64, 11)
    # no (fresh) engine figures: our own count is all there is
    assert load.current(None, None, 0, 7, 64) == (7, 0)


def test_a_hopeless_request_takes_the_cheapest_capacity_not_the_fastest() -> None:
    """1 ms is out of reach everywhere: sent to the fastest backend it would only take capacity from
    requests that can still make their budgets, so it goes where capacity is cheapest."""
    hopeless = choose(ask(ttft_budget_ms=1), snap(*FLEET), Rules())
    assert hopeless.reason is Reason.BEST_EFFORT
    lead = hopeless.candidates[0]
    # (the capacity's price is its prefill work plus its share of decoding: for this prompt-heavy
    # request that may well be the fastest GPU; what matters is that price, not speed, decides)
    assert lead.terms["cost"] == max(c.terms["cost"] for c in hopeless.candidates)
    # within twice the budget somewhere, it still goes where it misses least: it may yet make it
    near = min(predict(LLAMA_8B, s, 1000, 200).ttft_ms for s in FLEET) / 1.5
    assert choose(ask(ttft_budget_ms=near), snap(*FLEET), Rules()).candidates[0].backend == "trt-h100"


def test_a_request_that_would_queue_past_the_admission_limit_is_shed_with_a_retry_after() -> None:
    """500 streams on an engine running 4 at a time: shed at once, not a 504 a minute later (issue 12.4)."""
    busy = replace(backend("b0", "vllm", "A100-80GB"), running=4, waiting=496, engine_slots=4)
    rules = Rules(max_queue_wait_ms=20_000)
    decision = choose(ask(), snap(busy), rules)
    assert decision.reason is Reason.OVERLOADED and not decision.candidates
    assert decision.retry_after_s is not None and decision.retry_after_s >= 1
    assert decision.excluded["b0"].startswith("queue full")
    assert choose(ask(), snap(busy), Rules()).candidates, "no admission limit configured: queued as before"


def test_a_request_predicted_past_the_shed_ratio_of_its_budget_everywhere_is_shed() -> None:
    """Past saturation a request far over its budget everywhere only delays the ones that can still
    make theirs: with ``shed_ratio`` it is shed (503 with Retry-After) instead; within the ratio
    somewhere, without a budget, or while a backend is free (a budget no backend meets even idle is
    not overload: a 503 would be retried in vain), it is served as before."""
    queued = [replace(s, running=s.profile.max_concurrency, waiting=2 * s.profile.max_concurrency) for s in FLEET]
    assert all(predict(LLAMA_8B, s, 1000, 200).queue_ms > 0 for s in queued)
    best = min(predict(LLAMA_8B, s, 1000, 200).ttft_ms for s in queued)
    rules = Rules(shed_ratio=3.0)
    shed = choose(ask(ttft_budget_ms=best / 4), snap(*queued), rules)
    assert shed.reason is Reason.OVERLOADED and not shed.candidates
    assert shed.retry_after_s is not None and shed.retry_after_s >= 1
    assert set(shed.excluded) == {s.name for s in FLEET} and "over the shed ratio 3" in shed.excluded["trt-h100"]
    assert choose(ask(ttft_budget_ms=best / 2), snap(*queued), rules).reason is Reason.BEST_EFFORT
    assert choose(ask(), snap(*queued), rules).candidates  # no budget: nothing to be hopeless about
    assert choose(ask(ttft_budget_ms=best / 4), snap(*queued), Rules()).candidates  # off by default
    idle_best = min(predict(LLAMA_8B, s, 1000, 200).ttft_ms for s in FLEET)
    assert choose(ask(ttft_budget_ms=idle_best / 4), snap(*FLEET), rules).candidates  # nothing queues: served late


def test_low_priority_requests_are_shed_first() -> None:
    wait = predict_queue_ms(replace(backend("b0", "vllm", "A100-80GB"), running=4, waiting=40, engine_slots=4))
    busy = replace(backend("b0", "vllm", "A100-80GB"), running=4, waiting=40, engine_slots=4)
    rules = Rules(max_queue_wait_ms=wait * 0.8)  # the queue is a little past the limit
    assert choose(ask(priority=-1), snap(busy), rules).reason is Reason.OVERLOADED
    assert choose(ask(priority=0), snap(busy), rules).reason is Reason.OVERLOADED
    assert choose(ask(priority=1), snap(busy), rules).candidates  # may wait twice the limit


def predict_queue_ms(state: BackendState) -> float:
    return choose(ask(), snap(state), Rules()).candidates[0].prediction.queue_ms

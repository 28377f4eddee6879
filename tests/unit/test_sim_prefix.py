"""The simulator's prefix caches, the prefix-annotated workloads and the cache-aware peer policies."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.rules import Rules
from routing.sim.engine import Job, SimEngine
from routing.sim.peers import LlmD, PowerOfTwo, SglangCacheAware, ShortestQueueKv
from routing.sim.policies import BackendView, Enginegate, RoundRobin
from routing.sim.simulate import SimFleet, simulate
from routing.sim.traces import TraceRow, load_mooncake, load_trace
from routing.sim.workload import ChatShape, SimRequest, chat_sessions, ideal_reuse
from routing.types import BackendProfile, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ModelSpec("m8", 8, BYTES_PER_PARAM["bf16"], 131072, 131072)


def profile(name: str) -> BackendProfile:
    return BackendProfile(name, "vllm", frozenset({"m8"}), GPUS["H100"], 1, 80.0, ENGINES["vllm"], 256, 4.0)


def request(i: int, at: float, blocks: tuple[int, ...], prompt: int | None = None, key: int = 0) -> SimRequest:
    tokens = prompt if prompt is not None else len(blocks) * 64 + 10
    return SimRequest(i, at, tokens, 20, "interactive", 500.0, None, blocks, 64, 0, key)


def run_alone(engine: SimEngine, job: Job) -> None:
    engine.submit(job)
    now = 0.0
    while (duration := engine.start_step()) is not None:
        now += duration
        engine.end_step(now, duration)


def test_an_engine_prefills_only_what_its_prefix_cache_lacks() -> None:
    engine = SimEngine(profile("a"), LLAMA_8B)
    first = Job(request(0, 0.0, tuple(range(100))), "m8")
    run_alone(engine, first)
    again = Job(request(1, 0.0, (*range(100), 500, 501)), "m8")
    run_alone(engine, again)
    assert first.cached_tokens == 0
    assert again.cached_tokens == 100 * 64  # the shared 100 blocks, not the two new ones
    assert again.ttft_s is not None and first.ttft_s is not None and again.ttft_s < first.ttft_s / 5
    # another prefix altogether finds nothing; an engine that went down starts cold
    other = Job(request(2, 0.0, (900, 901)), "m8")
    run_alone(engine, other)
    assert other.cached_tokens == 0
    engine.take_down()
    engine.up = True
    cold = Job(request(3, 0.0, tuple(range(100))), "m8")
    run_alone(engine, cold)
    assert cold.cached_tokens == 0


def test_mooncake_trace_is_read_with_its_blocks(tmp_path: Path) -> None:
    rows = load_trace(ROOT / "data/traces/mooncake_synthetic_trace.jsonl")
    assert len(rows) == 3993 and rows[0].arrival_s == 0.0 and rows[-1].arrival_s == pytest.approx(1022.025)
    first = rows[0]
    assert first.prompt_tokens == 40160 and first.block_tokens == 512 and len(first.blocks) == 40160 // 512
    assert 0.5 < ideal_reuse(rows) < 0.8
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: hash_ids"):
        load_mooncake(bad)


def test_chat_sessions_grow_turn_by_turn_on_shared_system_prompts() -> None:
    arrivals = [TraceRow(i * 2.0, 800, 100) for i in range(400)]
    rows = chat_sessions(arrivals, ChatShape(systems=3), seed=1)
    assert len(rows) == 400 and [r.arrival_s for r in rows] == [a.arrival_s for a in arrivals]
    by_key: dict[int, list[TraceRow]] = {}
    for r in rows:
        by_key.setdefault(r.key, []).append(r)
        assert len(r.blocks) == r.prompt_tokens // r.block_tokens
    turns = [c for c in by_key.values() if len(c) > 1]
    assert turns, "some conversations take more than one turn"
    for conversation in turns:
        for before, after in itertools.pairwise(conversation):
            assert after.blocks[: len(before.blocks)] == before.blocks  # each turn extends the last prompt
    systems = {r.blocks[: r.preamble_blocks] for r in rows}
    assert len(systems) <= 3  # everyone opens with one of the shared system prompts
    assert ideal_reuse(rows) > 0.5
    assert chat_sessions(arrivals, ChatShape(systems=3), seed=1) == rows  # deterministic


def views(n: int) -> list[BackendView]:
    return [BackendView(SimEngine(profile(f"b{i}"), LLAMA_8B)) for i in range(n)]


def test_power_of_two_picks_the_less_busy_of_two_and_jsq_counts_kv() -> None:
    vs = views(2)
    vs[0].in_flight = 5
    job = Job(request(0, 0.0, ()), "m8")
    assert all(PowerOfTwo(seed).pick(job, vs) is vs[1] for seed in range(5))
    vs[0].in_flight, vs[1].polled_kv = 0, 0.9
    assert ShortestQueueKv().pick(job, vs) is vs[0]


def test_sglang_follows_the_prefix_until_load_is_imbalanced() -> None:
    vs = views(3)
    policy = SglangCacheAware()
    prompt = tuple(range(50))
    home = policy.pick(Job(request(0, 0.0, prompt), "m8"), vs)
    assert policy.pick(Job(request(1, 0.0, (*prompt, 99)), "m8"), vs) is home
    home.in_flight = 40  # more than 32 above the other: balance wins over the cache
    assert policy.pick(Job(request(2, 0.0, (*prompt, 98)), "m8"), vs) is not home
    # a prompt matching less than half goes to the smallest tree: the backend sent nothing yet
    home.in_flight = 0
    untouched = next(v for v in vs if policy._blocks.of(v).tokens == 0)
    assert policy.pick(Job(request(3, 0.0, tuple(range(1000, 1050))), "m8"), vs) is untouched


def test_llm_d_scores_the_prefix_it_routed() -> None:
    vs = views(3)
    policy = LlmD()
    prompt = tuple(range(40))
    home = policy.pick(Job(request(0, 0.0, prompt), "m8"), vs)
    assert policy.pick(Job(request(1, 0.0, (*prompt, 7)), "m8"), vs) is home


def _conversations(n: int, turns: int) -> list[SimRequest]:
    out: list[SimRequest] = []
    at = 0.0
    for t in range(turns):
        for c in range(n):
            blocks = tuple(range(c * 10_000, c * 10_000 + 40 * (t + 1)))
            out.append(request(len(out), at, blocks, key=c))
            at += 0.05
    return out


def test_cache_aware_placement_reuses_more_than_round_robin_in_the_simulator() -> None:
    fleet = SimFleet(tuple(profile(f"b{i}") for i in range(4)), {"m8": LLAMA_8B}, Rules(), poll_s=1.0)
    requests = _conversations(15, 5)  # not a multiple of 4, or round robin would be sticky by accident
    models = ["m8"] * len(requests)
    ours = simulate(fleet, requests, models, Enginegate(fleet.rules, fleet.models))
    rr = simulate(fleet, requests, models, RoundRobin())
    two = simulate(fleet, requests, models, Enginegate(fleet.rules, fleet.models, replicas=2, seed=3))
    ideal = 10 / 15  # turn t reuses the 40 t blocks of turn t - 1
    assert ours.cache_hit_rate > 0.95 * ideal and ours.cache_hit_rate >= 2 * rr.cache_hit_rate
    # two replicas that share nothing agree on a new conversation's home (rendezvous) but not on
    # where load sent it: they lose part of the reuse, still far above round robin
    assert two.policy == "enginegate_2x" and 3 * rr.cache_hit_rate < two.cache_hit_rate < ours.cache_hit_rate
    busy = sorted(ours.busy_s.values())
    assert busy[-1] < 1.5 * busy[0] + 1e-9  # and the conversations are spread, not piled on one engine

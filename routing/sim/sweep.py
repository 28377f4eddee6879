"""Comparisons: a trace replayed at several request rates through chosen policies on one or more fleets."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from routing.rules import Rules
from routing.sim.capacity import ModelCapacity, capacities
from routing.sim.peers import strong_peers
from routing.sim.policies import Enginegate, LeastBusy, LowestLatency, Policy, Random, RoundRobin, StaticTable
from routing.sim.report import Point
from routing.sim.simulate import SimFleet, assign_models, capacity_rps, simulate
from routing.sim.traces import TraceRow, mean_rate
from routing.sim.workload import DEFAULT_MIX, BudgetMix, build_workload, ideal_reuse
from routing.types import ModelSpec

SHARE_DELAY_S = 0.005
"""How late a replica hears of another's send through Redis pub/sub (a round trip on one network)."""


def all_policies(rules: Rules, models: dict[str, ModelSpec], seed: int) -> list[Policy]:
    """The line-up a sweep compares: simple baselines, the strong peers (``peers``) and enginegate
    alone, in two replicas, and in two replicas sharing prefix blocks."""
    return [
        RoundRobin(), Random(seed), LeastBusy(seed), LowestLatency(seed), StaticTable(),
        *strong_peers(seed), Enginegate(rules, models), Enginegate(rules, models, replicas=2, seed=seed),
        Enginegate(rules, models, replicas=2, seed=seed, share_s=SHARE_DELAY_S),
    ]  # fmt: skip


POLICY_NAMES = (
    "round_robin", "random", "least_busy", "latency", "static", "power_of_two", "jsq_kv", "llm_d", "llm_d_slo",
    "sglang", "enginegate", "enginegate_2x", "enginegate_2x_shared",
)  # fmt: skip
"""Every policy a comparison can run, in ``all_policies``' order."""
DEFAULT_POLICIES = ("enginegate", "round_robin", "llm_d")
"""What ``enginegate simulate`` runs unless told: the gateway's policy, the simplest baseline and the
strongest peer (llm-d's scheduler)."""


def policy_factory(names: Sequence[str], rules: Rules, models: dict[str, ModelSpec], seed: int) -> list[Policy]:
    """Fresh instances of the named policies, in the order named; ValueError naming the known ones."""
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise ValueError(
            f"unknown policies {', '.join(unknown) or '(none named)'}: choose from {', '.join(POLICY_NAMES)}"
        )
    every = {p.name: p for p in all_policies(rules, models, seed)}
    return [every[n] for n in names]


def parse_shares(text: str) -> list[tuple[str, float]]:
    """``name:share,name:share`` (shares are normalised)."""
    shares = []
    for item in text.split(","):
        name, sep, share = item.strip().rpartition(":")
        if not sep or not name:
            raise ValueError(f"model share {item.strip()!r}: expected name:share")
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"model share {item.strip()!r}: {share!r} is not a number") from None
        if value < 0:
            raise ValueError(f"model share {item.strip()!r}: negative")
        shares.append((name, value))
    total = sum(s for _, s in shares)
    if total <= 0:
        raise ValueError("model shares sum to zero")
    return [(n, s / total) for n, s in shares]


def seeded(fleet: SimFleet, seed: int) -> SimFleet:
    """The fleet with its engines' hidden speeds and step noise drawn from ``seed`` (the run's seed)."""
    return replace(fleet, truth=replace(fleet.truth, seed=seed))


@dataclass(frozen=True)
class Comparison:
    """Fleets compared at the same absolute request rates."""

    capacities: dict[str, list[ModelCapacity]]
    """Per fleet label: each model's capacity, the bottleneck first."""
    points: list[Point]


def compare(
    fleets: Mapping[str, SimFleet],
    rows: Sequence[TraceRow],
    model_shares: Sequence[tuple[str, float]],
    *,
    rates: Sequence[float] | None = None,
    loads: Sequence[float] = (),
    mix: BudgetMix = DEFAULT_MIX,
    seed: int = 0,
    duration_s: float | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    progress: Callable[[int, int, str], None] = lambda done, total, line: None,
) -> Comparison:
    """Each fleet through each policy at each request rate (``rates``, requests/s; else ``loads``, shares
    of the first fleet's estimated capacity, the same absolute rates for every fleet). Every fleet and
    policy replays the very same requests at a rate; ``progress(done, total, line)`` after each run."""
    if not fleets:
        raise ValueError("no fleet to simulate")
    fleets = {label: seeded(fleet, seed) for label, fleet in fleets.items()}
    for label, fleet in fleets.items():
        unknown = sorted({m for m, _ in model_shares} - set(fleet.models))
        if unknown:
            raise ValueError(f"{label}: models not in the fleet: {', '.join(unknown)}")
    policy_factory(policies, Rules(), {}, seed)  # unknown names fail before anything runs
    base = build_workload(rows, mix=mix, seed=seed)
    base_models = assign_models(base, model_shares, seed)
    # Capacity with every reusable prefix reused (the ideal cache): a workload whose prompts repeat can
    # be served faster, and a share of the uncached capacity would leave every router idle.
    reuse = 1 - ideal_reuse(rows)
    caps = {label: capacities(fleet, base, base_models, reuse) for label, fleet in fleets.items()}
    first = next(iter(caps.values()))
    absolute = list(rates) if rates is not None else [load * first[0].fleet_rps for load in loads]
    if not absolute or not all(math.isfinite(r) and r > 0 for r in absolute):
        raise ValueError(f"request rates must be positive numbers, got {absolute}")
    trace_rate = mean_rate(rows)
    points = []
    total, done = len(absolute) * len(fleets) * len(policies), 0
    for rate in absolute:
        requests = build_workload(rows, rate_scale=rate / trace_rate, duration_s=duration_s, mix=mix, seed=seed)
        models = assign_models(requests, model_shares, seed)
        for label, fleet in fleets.items():
            capacity = caps[label][0].fleet_rps
            for policy in policy_factory(policies, fleet.rules, fleet.models, seed):
                result = simulate(fleet, requests, models, policy)
                points.append(Point(rate / capacity if capacity > 0 else math.inf, result, rate, label))
                done += 1
                progress(
                    done, total, f"{label} {rate:.2f} req/s {result.policy}: {result.attainment:.1%} within budget"
                )
    return Comparison(caps, points)


def sweep(
    fleet: SimFleet,
    rows: Sequence[TraceRow],
    loads: Sequence[float],
    model_shares: Sequence[tuple[str, float]],
    *,
    mix: BudgetMix = DEFAULT_MIX,
    seed: int = 0,
    duration_s: float | None = None,
    policies: Callable[[], list[Policy]] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[float, list[Point]]:
    """(the fleet's estimated capacity in requests/s, a point per load and policy): one fleet, loads
    relative to its capacity (``capacity_rps``, with the prefill an ideal cache leaves), every policy
    (or those ``policies`` makes) on the very same requests."""
    unknown = sorted({m for m, _ in model_shares} - set(fleet.models))
    if unknown:
        raise ValueError(f"models not in the fleet: {', '.join(unknown)}")
    fleet = seeded(fleet, seed)
    make = policies or (lambda: all_policies(fleet.rules, fleet.models, seed))
    base = build_workload(rows, mix=mix, seed=seed)
    capacity = capacity_rps(fleet, base, assign_models(base, model_shares, seed), 1 - ideal_reuse(rows))
    trace_rate = mean_rate(rows)
    points = []
    for load in loads:
        requests = build_workload(
            rows, rate_scale=load * capacity / trace_rate, duration_s=duration_s, mix=mix, seed=seed
        )
        models = assign_models(requests, model_shares, seed)
        for policy in make():
            result = simulate(fleet, requests, models, policy)
            points.append(Point(load, result, load * capacity))
            progress(f"load {load:.0%} {result.policy}: {result.attainment:.1%} within budget")
    return capacity, points

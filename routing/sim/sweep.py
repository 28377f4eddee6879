"""One comparison: a trace replayed at several offered loads through every policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from routing.sim.peers import strong_peers
from routing.sim.policies import Enginegate, LeastBusy, LowestLatency, Policy, Random, RoundRobin, StaticTable
from routing.sim.report import Point
from routing.sim.simulate import SimFleet, assign_models, capacity_rps, simulate
from routing.sim.traces import TraceRow, mean_rate
from routing.sim.workload import DEFAULT_MIX, BudgetMix, build_workload, ideal_reuse
from routing.types import ModelSpec, Rules

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
    """(the fleet's estimated capacity in requests/s, a point per load and policy).

    Offered load 1.0 replays the trace at the rate the fleet is estimated to saturate at
    (``capacity_rps``, with the prefill an ideal cache leaves); every policy replays the very same
    requests.
    """
    unknown = sorted({m for m, _ in model_shares} - set(fleet.models))
    if unknown:
        raise ValueError(f"models not in the fleet: {', '.join(unknown)}")
    make = policies or (lambda: all_policies(fleet.rules, fleet.models, seed))
    base = build_workload(rows, mix=mix, seed=seed)
    # Load is relative to the capacity with every reusable prefix reused (the ideal cache): a
    # workload whose prompts repeat can be served faster, and a share of the uncached capacity
    # would leave every router idle.
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
            points.append(Point(load, result))
            progress(f"load {load:.0%} {result.policy}: {result.attainment:.1%} within budget")
    return capacity, points

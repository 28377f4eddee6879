"""Logged requests (or a trace's) replayed under two configs: where decisions move, and what the
simulator says each config does to budgets, first-token times and GPU cost at the logged rate and above.

The gateway's request log (one JSON object per request, ``msg: "request"``, written by
``gateway.pipeline.lifecycle``) carries what routing saw of each request, never its text: model,
estimated prompt tokens, answer tokens, budgets, priority, tenant, key and team, the rule headers,
capabilities and arrival time. A trace (``routing.sim.traces``) has only arrivals and token counts:
its requests get models in equal shares and budgets from the simulator's default mix.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.config import LoadedConfig
from gateway.fleet.catalog import rules as build_rules
from gateway.whatif.fleets import idle_snapshot, sim_fleet
from gateway.whatif.records import Replayed, from_log, replayable
from routing.decisions import Reason
from routing.policy import choose
from routing.sim.policies import Enginegate
from routing.sim.simulate import simulate
from routing.sim.traces import load_trace
from routing.sim.workload import DEFAULT_MIX, SimRequest
from routing.types import RequestFeatures

DEFAULT_SCALES = (1.0, 2.0, 4.0)
"""Rates simulated unless told: the logged rate, twice and four times it."""


def _is_request_log(path: Path) -> bool:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    return False
                return isinstance(doc, dict) and ("msg" in doc or "arrived_at" in doc)
    return False


def read_requests(path: Path, models: Sequence[str], seed: int = 0) -> list[Replayed]:
    """The requests of a gateway request log, or of a trace (models in equal shares of ``models``);
    ValueError naming ``FILE:LINE`` for what cannot be read."""
    if path.suffix in (".jsonl", ".ndjson", ".log", ".json") and _is_request_log(path):
        out = []
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.lstrip().startswith("{"):
                    continue  # a blank line, or a process's own output in a log captured with 2>&1
                try:
                    doc = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
                request = from_log(doc) if isinstance(doc, dict) else None
                if request is not None:
                    out.append(request)
        if not out:
            raise ValueError(f'{path}: no routed requests (lines with msg "request" and arrived_at)')
        return out
    rng = random.Random(seed)
    replayed = []
    for row in load_trace(path):
        klass = DEFAULT_MIX.draw(rng)
        features = RequestFeatures(
            model=rng.choice(list(models)), prompt_tokens=row.prompt_tokens, max_tokens=None,
            stream=klass.ttft_budget_ms is not None, ttft_budget_ms=klass.ttft_budget_ms,
            latency_budget_ms=klass.latency_budget_ms,
        )  # fmt: skip
        replayed.append(Replayed(row.arrival_s, features, row.output_tokens))
    return replayed


def _where(features: RequestFeatures, snapshot: Any, rules: Any) -> str:
    decision = choose(features, snapshot, rules)
    if decision.reason is Reason.BUDGET_UNMEETABLE or not decision.candidates:
        return f"refused ({decision.reason.value})"
    return decision.candidates[0].backend


def moves(requests: Sequence[Replayed], old: LoadedConfig, new: LoadedConfig) -> dict[str, Any]:
    """Where ``routing.choose`` sends each request under each config, every backend healthy and idle
    (the same fleet state for both): how many go elsewhere, and from where to where."""
    before = (idle_snapshot(old), build_rules(old))
    after = (idle_snapshot(new), build_rules(new))
    pairs: Counter[tuple[str, str]] = Counter()
    for r in requests:
        features = replayable(r.features)
        pairs[(_where(features, *before), _where(features, *after))] += 1
    moved = sum(n for (a, b), n in pairs.items() if a != b)
    return {
        "requests": len(requests),
        "moved": moved,
        "moved_share": moved / len(requests) if requests else 0.0,
        "from_to": [
            {"from": a, "to": b, "count": n} for (a, b), n in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


class NoRate(ValueError):
    """The requests arrived at one instant (or there is one): no rate to simulate them at."""


def logged_rate(requests: Sequence[Replayed]) -> float:
    """Requests per second between the first and last arrival."""
    times = [r.arrived_at for r in requests]
    span = max(times, default=0.0) - min(times, default=0.0)
    if len(times) < 2 or span <= 0:
        raise NoRate("the requests need at least two arrivals at different times to have a rate")
    return (len(times) - 1) / span


def _sim_requests(requests: Sequence[Replayed], scale: float) -> list[SimRequest]:
    known = [r.output_tokens for r in requests if r.output_tokens]
    typical = round(sum(known) / len(known)) if known else 256
    start = min(r.arrived_at for r in requests)
    ordered = sorted(requests, key=lambda r: r.arrived_at)
    return [
        SimRequest(
            id=i,
            arrival_s=(r.arrived_at - start) / scale,
            prompt_tokens=max(1, r.features.prompt_tokens),
            output_tokens=max(1, r.output_tokens or r.features.max_tokens or typical),
            klass="logged",
            ttft_budget_ms=r.features.ttft_budget_ms,
            latency_budget_ms=r.features.latency_budget_ms,
            key=i,
        )
        for i, r in enumerate(ordered)
    ]


def table(
    requests: Sequence[Replayed],
    configs: Mapping[str, LoadedConfig],
    rates: Sequence[float] | None = None,
    scales: Sequence[float] = DEFAULT_SCALES,
    deadline_s: float | None = None,
) -> list[dict[str, Any]]:
    """The simulator's outcome per config at each rate (``rates`` in requests/s, else ``scales`` of the
    logged rate): enginegate's policy on each config's fleet, the very same requests for both. Rates
    not reached within ``deadline_s`` seconds (wall clock) are left out."""
    base = logged_rate(requests)
    absolute = list(rates) if rates else [base * s for s in scales]
    if not all(math.isfinite(r) and r > 0 for r in absolute):
        raise ValueError(f"request rates must be positive numbers, got {absolute}")
    fleets = {label: sim_fleet(loaded) for label, loaded in configs.items()}
    started = time.monotonic()
    rows = []
    for rate in absolute:
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            break
        replay = _sim_requests(requests, rate / base)
        models = [r.features.model for r in sorted(requests, key=lambda r: r.arrived_at)]
        for label, fleet in fleets.items():
            result = simulate(fleet, replay, models, Enginegate(fleet.rules, fleet.models))
            rows.append({
                "config": label, "rate_rps": round(rate, 4), "scale": round(rate / base, 3),
                "within_budget_pct": round(result.attainment * 100, 2),
                "ttft_p50_ms": _ms(result.percentile("ttft", 0.5)), "ttft_p99_ms": _ms(result.percentile("ttft", 0.99)),
                "gpu_usd_per_hour": round(result.fleet_cost_per_hour, 2),
                "busy_gpu_usd_per_hour": round(result.busy_cost_per_hour, 2),
                "failures": result.failures,
            })  # fmt: skip
    return rows


def _ms(seconds: float) -> float | None:
    return None if seconds != seconds else round(seconds * 1000, 1)

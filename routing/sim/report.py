"""Simulation results as terminal and markdown tables, every column with its unit (plots: gateway/ops/sim_plots.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.sim.engine import FAILURES
from routing.sim.simulate import Result


@dataclass(frozen=True)
class Point:
    """One policy on one fleet at one request rate."""

    load: float
    """The rate as a share of this fleet's estimated capacity."""
    result: Result
    rate_rps: float = 0.0
    """The offered request rate, requests/s."""
    fleet: str = ""
    """Which fleet (a config's name) when several are compared."""


FAILURE_COLUMNS = {
    "shed": "shed (503)", "hopeless": "hopeless (503)", "strict_429": "strict 429", "no_backend": "no backend",
    "lost": "lost",
}  # fmt: skip
"""How each ``engine.FAILURES`` reason heads its column: requests without an answer, counted."""
assert set(FAILURE_COLUMNS) == set(FAILURES)

COLUMNS = (
    "rate req/s", "load %", "policy", "within budget %", "rejected", "cache hits %", "goodput req/s",
    "TTFT p50 ms", "TTFT p99 ms", "e2e p50 s", "e2e p99 s", *FAILURE_COLUMNS.values(), "busy GPU $/h",
    "busy $ per 1k met", "fleet GPU $/h", "busiest backend (busy %)",
)  # fmt: skip

CAPTION = (
    "`rejected`: requests refused without an answer (shed by admission, shed by enginegate as predicted "
    "hopeless, strict 429, no backend), counted as missed in `within budget`. TTFT and e2e percentiles are "
    "over every request, one without an answer (rejected or lost) counting as never answered: a percentile "
    "that falls on those reads `never`. "
    "`busy GPU $/h` prices the time engines worked, so a rejected request costs nothing there (it was shed "
    "before it started); `busy $ per 1k met` divides the busy cost over the arrival window by the requests "
    "answered within budget, so work spent on misses and capacity idled by rejections are charged to them."
)
"""The rules of the table, for its caption."""


def _ms(seconds: float) -> str:
    if seconds == float("inf"):
        return "never"
    return "-" if seconds != seconds else f"{seconds * 1000:.0f}"  # NaN: no requests


def _s(seconds: float) -> str:
    if seconds == float("inf"):
        return "never"
    return "-" if seconds != seconds else f"{seconds:.1f}"


def _per_met(r: Result) -> str:
    met = sum(j.within_budget for j in r.jobs)
    return f"{r.busy_cost / met * 1000:.2f}" if met else "-"


def row(point: Point) -> list[str]:
    r = point.result
    name, busiest = max(r.utilization.items(), key=lambda kv: kv[1]) if r.utilization else ("-", 0.0)
    failures = r.failures
    return [
        f"{point.rate_rps:.2f}",
        f"{point.load:.0%}".rstrip("%"),
        r.policy,
        f"{r.attainment * 100:.1f}",
        str(r.rejected),
        f"{r.cache_hit_rate * 100:.1f}",
        f"{r.goodput:.2f}",
        _ms(r.percentile("ttft", 0.5, unanswered=True)),
        _ms(r.percentile("ttft", 0.99, unanswered=True)),
        _s(r.percentile("e2e", 0.5, unanswered=True)),
        _s(r.percentile("e2e", 0.99, unanswered=True)),
        *(str(failures[reason]) for reason in FAILURE_COLUMNS),
        f"{r.busy_cost_per_hour:.2f}",
        _per_met(r),
        f"{r.fleet_cost_per_hour:.2f}",
        f"{name} ({busiest:.0%})",
    ]


def _table(points: Sequence[Point]) -> list[list[str]]:
    several = len({p.fleet for p in points}) > 1
    head = ["fleet", *COLUMNS] if several else list(COLUMNS)
    return [head, *(([p.fleet] if several else []) + row(p) for p in points)]


def markdown(points: Sequence[Point]) -> str:
    head, *rows = _table(points)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def text(points: Sequence[Point]) -> str:
    rows = _table(points)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def utilization(points: Sequence[Point]) -> str:
    """Busy share of every backend per fleet, rate and policy, as a markdown table (%; above 100: work
    still draining after the last arrival)."""
    lines = []
    for fleet in dict.fromkeys(p.fleet for p in points):
        mine = [p for p in points if p.fleet == fleet]
        names = list(mine[0].result.utilization)
        title = f"{fleet}: " if fleet else ""
        lines += ["", f"{title}busy share of each backend (%)"] if fleet else []
        lines += ["| rate req/s | policy | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
        for p in mine:
            u = p.result.utilization
            lines.append(
                f"| {p.rate_rps:.2f} | {p.result.policy} | " + " | ".join(f"{u[n] * 100:.0f}" for n in names) + " |"
            )
    return "\n".join(lines).strip("\n")


def failure_legend() -> str:
    """What each failure column counts."""
    return "\n".join(f"{FAILURE_COLUMNS[k]}: {why}" for k, why in FAILURES.items())


ERROR_COLUMNS = (
    "rate req/s", "load %", "policy", "predicted", "TTFT err p50 %", "TTFT err p90 %", "e2e err p50 %",
    "e2e err p90 %", "e2e err, true length, p50 %", "e2e err, true length, p90 %",
)  # fmt: skip


def _quantiles(errors: Sequence[float]) -> tuple[str, str]:
    if not errors:
        return "-", "-"
    ordered = sorted(errors)
    at = [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9)]
    return f"{at[0] * 100:.0f}", f"{at[1] * 100:.0f}"


def errors(points: Sequence[Point]) -> str:
    """The router's prediction error against the ground truth, per point whose policy predicts (markdown):
    absolute error as a share of what happened, median and 90th percentile, over answered requests."""
    several = len({p.fleet for p in points}) > 1
    head = (["fleet"] if several else []) + list(ERROR_COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        r = p.result
        ttft = r.prediction_errors("ttft")
        if not ttft:
            continue
        cells = [f"{p.rate_rps:.2f}", f"{p.load:.0%}".rstrip("%"), r.policy, str(len(ttft)), *_quantiles(ttft)]
        cells += [*_quantiles(r.prediction_errors("e2e")), *_quantiles(r.prediction_errors("e2e_known"))]
        lines.append("| " + " | ".join(([p.fleet] if several else []) + cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""

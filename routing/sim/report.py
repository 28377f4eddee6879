"""Simulation results as a terminal/markdown table and as a PNG plot of attainment against load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from routing.sim.simulate import Result


@dataclass(frozen=True)
class Point:
    """One policy at one offered load (a share of the fleet's estimated capacity)."""

    load: float
    result: Result


COLUMNS = (
    "load", "policy", "within budget", "cache hits", "goodput req/s", "p50 TTFT s", "p99 TTFT s", "p50 e2e s",
    "p99 e2e s", "failed", "busy GPU $", "fleet $", "busiest backend",
)  # fmt: skip


def row(point: Point) -> list[str]:
    r = point.result
    name, busiest = max(r.utilization.items(), key=lambda kv: kv[1]) if r.utilization else ("-", 0.0)
    return [
        f"{point.load:.0%}",
        r.policy,
        f"{r.attainment:.1%}",
        f"{r.cache_hit_rate:.1%}",
        f"{r.goodput:.2f}",
        f"{r.percentile('ttft', 0.5):.2f}",
        f"{r.percentile('ttft', 0.99):.1f}",
        f"{r.percentile('e2e', 0.5):.1f}",
        f"{r.percentile('e2e', 0.99):.1f}",
        str(r.failed + r.rejected),
        f"{r.busy_cost:.1f}",
        f"{r.fleet_cost:.1f}",
        f"{name} {busiest:.0%}",
    ]


def markdown(points: Sequence[Point]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(p)) + " |" for p in points]
    return "\n".join(lines)


def text(points: Sequence[Point]) -> str:
    rows = [list(COLUMNS), *(row(p) for p in points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def utilization(points: Sequence[Point]) -> str:
    """Busy share of every backend per policy and load, as a markdown table."""
    names = list(points[0].result.utilization) if points else []
    lines = ["| load | policy | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for p in points:
        u = p.result.utilization
        lines.append(f"| {p.load:.0%} | {p.result.policy} | " + " | ".join(f"{u[n]:.0%}" for n in names) + " |")
    return "\n".join(lines)


def plot(points: Sequence[Point], path: Path, title: str) -> None:
    """Attainment against offered load, one line per policy (needs matplotlib: the ``sim`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for policy in dict.fromkeys(p.result.policy for p in points):
        mine = sorted((p.load, p.result.attainment) for p in points if p.result.policy == policy)
        style = {"linewidth": 2.5, "color": "black"} if policy == "enginegate" else {"linewidth": 1.2}
        ax.plot([x * 100 for x, _ in mine], [y * 100 for _, y in mine], marker="o", label=policy, **style)
    ax.set_xlabel("offered load (% of estimated fleet capacity)")
    ax.set_ylabel("requests within latency budget (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)

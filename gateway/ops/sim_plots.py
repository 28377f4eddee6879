"""PNG plots of a simulator comparison (needs matplotlib: the ``sim`` extra).

Kept apart from ``routing/sim``, which computes and does no I/O beyond reading traces.
Every line is one fleet x policy: a colour of its own and the fleet's line style with the policy's
marker, so lines stay apart in greyscale and where they overlap; the legend sits outside the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routing.sim.report import Point

_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def utilization_path(path: Path) -> Path:
    """Where ``plot`` writes the per-backend utilisation next to ``path``."""
    return path.with_name(f"{path.stem}_utilization{path.suffix or '.png'}")


def plot(points: Sequence[Point], path: Path, title: str) -> list[Path]:
    """Attainment and GPU $/h against the absolute request rate (``path``), and each backend's busy
    share per fleet (``utilization_path(path)``); returns the files written."""
    plt = _pyplot()
    fleets = list(dict.fromkeys(p.fleet for p in points))
    policies = list(dict.fromkeys(p.result.policy for p in points))
    colours = plt.get_cmap("tab10").colors + plt.get_cmap("Dark2").colors
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), dpi=110, sharex=True)
    n = 0
    for f, fleet in enumerate(fleets):
        for m, policy in enumerate(policies):
            mine = sorted((p.rate_rps, p.result) for p in points if p.fleet == fleet and p.result.policy == policy)
            if not mine:
                continue
            label = f"{fleet} · {policy}" if fleet else policy
            style = {
                "color": colours[n % len(colours)], "linestyle": _STYLES[f % len(_STYLES)],
                "marker": _MARKERS[m % len(_MARKERS)], "linewidth": 2.2 if policy == "enginegate" else 1.4,
            }  # fmt: skip
            n += 1
            rates = [rate for rate, _ in mine]
            top.plot(rates, [r.attainment * 100 for _, r in mine], label=label, **style)
            bottom.plot(rates, [r.busy_cost_per_hour for _, r in mine], **style)
        fleet_cost = next(p.result.fleet_cost_per_hour for p in points if p.fleet == fleet)
        bottom.axhline(fleet_cost, color="grey", linestyle=_STYLES[f % len(_STYLES)], linewidth=0.8)
        bottom.annotate(f"{fleet or 'fleet'} kept up: ${fleet_cost:.2f}/h", (0.01, fleet_cost), fontsize=7,
                        xycoords=("axes fraction", "data"), va="bottom", color="grey")  # fmt: skip
    top.set_ylabel("requests within latency budget (%)")
    top.set_ylim(0, 102)
    top.set_title(title)
    bottom.set_ylabel("GPU $/h while busy")
    bottom.set_xlabel("offered request rate (requests/s)")
    bottom.set_ylim(0, 1.15 * max(max(p.result.fleet_cost_per_hour, p.result.busy_cost_per_hour) for p in points))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return [path, _utilization(points, utilization_path(path), title)]


def _utilization(points: Sequence[Point], path: Path, title: str) -> Path:
    """Per fleet, each backend's busy share at each rate (the first policy run: enginegate by default)."""
    plt = _pyplot()
    fleets = list(dict.fromkeys(p.fleet for p in points))
    fig, axes = plt.subplots(len(fleets), 1, figsize=(9, 2.8 * len(fleets) + 0.6), dpi=110, squeeze=False)
    for ax, fleet in zip(axes[:, 0], fleets, strict=True):
        mine = [p for p in points if p.fleet == fleet]
        policy = mine[0].result.policy
        mine = sorted((p for p in mine if p.result.policy == policy), key=lambda p: p.rate_rps)
        names = list(mine[0].result.utilization)
        width = 0.8 / len(mine)
        for i, p in enumerate(mine):
            u = p.result.utilization
            xs = [j + (i - (len(mine) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, [u[name] * 100 for name in names], width, label=f"{p.rate_rps:.2f} req/s",
                   hatch="//" if i % 2 else None, edgecolor="black", linewidth=0.4)  # fmt: skip
        ax.axhline(100, color="red", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("busy (%)")
        ax.set_title(f"{fleet + ': ' if fleet else ''}{policy}, busy share of each backend", fontsize=9)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path

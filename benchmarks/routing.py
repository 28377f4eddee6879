"""Routing quality: both Azure traces replayed at several loads through every policy on the mixed fleet.

    python benchmarks/routing.py                 # writes benchmarks/results/routing.md and two PNGs

The fleet is configs/sim-fleet.yaml (8B and 70B Llama on TensorRT-LLM, vLLM, TGI, DeepSpeed-MII and
llama.cpp); 80% of requests ask for the 8B model. Budgets come from the default mix: interactive
chat (60%, first token within 500 ms), agent steps (25%, first token 2 s and whole answer 20 s) and
batch jobs (15%, whole answer within 2 minutes). Offered load is a share of the fleet's estimated
capacity on each trace. Numbers, not pass/fail; the script says whether enginegate's default policy
met the most budgets at every load and how its GPU cost compares.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.cli import sim_fleet  # noqa: E402
from gateway.config import load_config  # noqa: E402
from routing.sim import report  # noqa: E402
from routing.sim.sweep import parse_shares, sweep  # noqa: E402
from routing.sim.workload import load_trace  # noqa: E402

TRACES = {
    "conversation": ROOT / "data/traces/AzureLLMInferenceTrace_conv.csv",
    "code": ROOT / "data/traces/AzureLLMInferenceTrace_code.csv",
}


def verdict(points: list[report.Point]) -> list[str]:
    lines = []
    for load in sorted({p.load for p in points}):
        here = {p.result.policy: p.result for p in points if p.load == load}
        ours = here.pop("enginegate")
        best = max(here.values(), key=lambda r: r.attainment)
        cheaper = [n for n, r in here.items() if r.busy_cost < ours.busy_cost]
        lines.append(
            f"- {load:.0%}: enginegate {ours.attainment:.1%} within budget, best baseline {best.policy} "
            f"{best.attainment:.1%} ({(ours.attainment - best.attainment) * 100:+.1f} points); busy GPU cost "
            f"${ours.busy_cost:.1f}" + (f", higher than {', '.join(cheaper)}" if cheaper else ", the lowest")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/sim-fleet.yaml")
    parser.add_argument("--load", default="50,80,100,120")
    parser.add_argument("--models", default="llama-3.1-8b:0.8,llama-3.1-70b:0.2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    fleet = sim_fleet(load_config(args.config))
    loads = [float(x) / 100 for x in args.load.split(",")]
    sections = [
        "# Routing benchmark",
        "",
        f"Fleet `{args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config}`, "
        f"models {args.models}, seed {args.seed}; default budget mix. Written by `benchmarks/routing.py`.",
        "",
        "`within budget`: share of all requests whose first token and whole answer came within their budgets "
        "(failed and rejected requests count as missed). `busy GPU $`: price of the time backends were "
        "working (what a fleet that scales idle capacity away pays); `fleet $`: price of keeping the whole "
        "fleet up for the arrival window, the same for every policy.",
    ]
    for name, path in TRACES.items():
        started = time.perf_counter()
        capacity, points = sweep(
            fleet, load_trace(path), loads, parse_shares(args.models), seed=args.seed,
            progress=lambda line: print(line, file=sys.stderr),
        )  # fmt: skip
        took = time.perf_counter() - started
        png = args.out / f"routing_{name}.png"
        report.plot(points, png, f"Azure {name} trace, {args.config.name}")
        sections += [
            "",
            f"## Azure {name} trace",
            "",
            f"Estimated fleet capacity on this trace: {capacity:.2f} requests/s. "
            f"{len(loads)} loads x 6 policies simulated in {took:.0f} s.",
            "",
            report.markdown(points),
            "",
            *verdict(points),
            "",
            f"![attainment against load]({png.name})",
            "",
            "<details><summary>Busy share of each backend</summary>",
            "",
            report.utilization(points),
            "",
            "</details>",
        ]
    text = "\n".join(sections) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "routing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

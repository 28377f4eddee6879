"""``enginegate simulate``: a trace replayed through chosen routing policies on one or more fleets (gateway
configs) at the same absolute request rates; tables with units, the bottleneck, and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gateway.config import ConfigError, LoadedConfig, load_config
from gateway.ops.common import positive_numbers

if TYPE_CHECKING:
    from routing.sim.simulate import SimFleet


class ProgressBar:
    """``[#####.....] 12/40 label`` on one line of stderr, redrawn after each run: only where a person
    watches (a TTY) or when asked (``--progress``), so logs and pipes get no carriage returns."""

    WIDTH = 30

    def __init__(self, out: TextIO, enabled: bool) -> None:
        self.out = out
        self.enabled = enabled

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * done // max(1, total)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.out.write(f"\r[{bar}] {done}/{total} {label[:60]:<60}")
        if done >= total:
            self.out.write("\n")
        self.out.flush()


def _labels(paths: list[Path]) -> list[str]:
    stems = [p.stem for p in paths]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in paths]


def _configs(paths: list[Path]) -> dict[str, LoadedConfig] | None:
    out = {}
    for label, path in zip(_labels(paths), paths, strict=True):
        try:
            out[label] = load_config(path)
        except ConfigError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            return None
    return out


def _fleets(configs: dict[str, LoadedConfig], outages: list[str]) -> dict[str, SimFleet]:
    """Each config as a fleet; with several, an outage applies to those that have its backend (and is an
    error when none has)."""
    from gateway.whatif.fleets import sim_fleet

    if len(configs) == 1:
        return {label: sim_fleet(loaded, outages) for label, loaded in configs.items()}
    named = {b.name for loaded in configs.values() for b in loaded.config.backends}
    for text in outages:
        if text.rsplit(":", 2)[0] not in named:
            raise ValueError(f"--outage {text!r}: no fleet has that backend")
    return {
        label: sim_fleet(
            loaded, [o for o in outages if o.rsplit(":", 2)[0] in {b.name for b in loaded.config.backends}]
        )
        for label, loaded in configs.items()
    }


def _admitting(fleets: dict[str, SimFleet], admission: str) -> dict[str, SimFleet]:
    """``--admission``: ``config`` keeps each config's ``routing.max_queue_wait_s``, ``none`` turns
    admission off, a number of seconds sets it; for every policy alike."""
    from dataclasses import replace

    if admission == "config":
        return fleets
    limit = None if admission == "none" else positive_numbers(admission, "--admission")[0]
    return {label: replace(fleet, admission_s=limit) for label, fleet in fleets.items()}


def run(args: argparse.Namespace) -> int:
    from routing.sim import capacity, report
    from routing.sim.sweep import DEFAULT_POLICIES, POLICY_NAMES, compare, parse_shares
    from routing.sim.traces import load_trace
    from routing.sim.workload import DEFAULT_MIX, parse_mix

    configs = _configs(args.config or [args.config_default])
    if configs is None:
        return 1
    try:
        fleets = _admitting(_fleets(configs, args.outage or []), args.admission)
        rows = load_trace(args.trace)
        mix = parse_mix(args.mix) if args.mix else DEFAULT_MIX
        names = [m.name for m in next(iter(configs.values())).config.models if m.kind == "generate"]
        shares = parse_shares(args.models) if args.models else [(n, 1 / len(names)) for n in names]
        policies = (
            POLICY_NAMES if args.policies == "all"
            else [p.strip() for p in args.policies.split(",")] if args.policies else DEFAULT_POLICIES
        )  # fmt: skip
        rates = positive_numbers(args.rate, "--rate") if args.rate else None
        loads = [x / 100 for x in positive_numbers(args.load, "--load")] if rates is None else []
        bar = ProgressBar(sys.stderr, args.progress or sys.stderr.isatty())
        result = compare(
            fleets, rows, shares, rates=rates, loads=loads, mix=mix, seed=args.seed, duration_s=args.duration,
            policies=policies, progress=bar,
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        print(f"enginegate simulate: {exc}", file=sys.stderr)
        return 1
    for label, caps in result.capacities.items():
        print(f"{label}: {capacity.bottleneck(caps)}")
        for line in capacity.lines(caps):
            print(f"  {line}")
    print()
    print(report.text(result.points))
    print()
    print("Requests without an answer, by reason:")
    print(report.failure_legend())
    print("\nBusy share of each backend (%; above 100: work still draining after the last arrival):")
    print(report.utilization(result.points))
    errors = report.errors(result.points)
    if errors:
        print("\nThe router's predictions against the simulated engines (absolute error, % of the actual):")
        print(errors)
    if args.plot:
        try:
            from gateway.ops.sim_plots import plot

            written = plot(result.points, args.plot, f"{args.trace.name} on {', '.join(configs)}")
        except ImportError:
            print("--plot needs matplotlib: pip install 'enginegate[sim]'", file=sys.stderr)
            return 1
        for path in written:
            print(f"plot: {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_config: Path) -> None:
    """``enginegate simulate``."""
    p = sub.add_parser(
        "simulate", help="replay a trace through routing policies on one or more fleets at the same request rates"
    )
    p.add_argument(
        "--config", type=Path, action="append",
        help=f"a fleet (a gateway config); repeat to compare fleets side by side (default: {default_config})",
    )  # fmt: skip
    p.add_argument("--trace", type=Path, required=True, help="Azure LLM trace CSV, Mooncake JSONL, or CSV/JSONL")
    p.add_argument("--rate", help="offered request rates, requests/s, e.g. 2,5,10 (the same for every fleet)")
    p.add_argument(
        "--load", default="50,80,100,120",
        help="without --rate: offered loads, %% of the first fleet's estimated capacity (default: 50,80,100,120)",
    )  # fmt: skip
    p.add_argument(
        "--policies",
        help=f"policies to run, comma-separated, or 'all' (default: enginegate,round_robin,llm_d; known: "
        f"{', '.join(_policy_names())})",
    )
    p.add_argument("--models", help="model shares, e.g. llama-3.1-8b:0.8,llama-3.1-70b:0.2 (default: equal)")
    p.add_argument(
        "--mix", help="budget classes, e.g. chat:0.7:ttft=500,batch:0.3:e2e=60000 (default: the 60/25/15 mix)"
    )
    p.add_argument("--duration", type=float, help="simulated seconds to replay (default: the whole trace)")
    p.add_argument("--outage", action="append", metavar="BACKEND:START_S:END_S", help="take a backend down")
    p.add_argument(
        "--admission", default="config",
        help="for every policy alike: shed a request queued on an engine this many seconds, 'none', or 'config' "
        "(each config's routing.max_queue_wait_s; the default)",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=0,
        help="draws of models and budgets, engines' hidden speeds and step noise (default: 0)",
    )  # fmt: skip
    p.add_argument(
        "--plot", type=Path,
        help="write a PNG of attainment and GPU $/h against request rate, and PATH_utilization.png per backend",
    )  # fmt: skip
    p.add_argument("--progress", action="store_true", help="draw the progress bar on stderr even when not a TTY")
    p.set_defaults(func=run, config_default=default_config)


def _policy_names() -> tuple[str, ...]:
    from routing.sim.sweep import POLICY_NAMES

    return POLICY_NAMES

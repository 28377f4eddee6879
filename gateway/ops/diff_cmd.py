"""``enginegate config diff OLD NEW [--replay LOG|TRACE]``: what a new config would change, before a reload."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.ops.common import load_or_report, positive_numbers


def run(args: argparse.Namespace) -> int:
    from gateway.whatif.replay import read_requests
    from gateway.whatif.report import text, what_if

    old, new = load_or_report(args.old), load_or_report(args.new)
    if old is None or new is None:
        return 1
    try:
        rates = positive_numbers(args.rate, "--rate") if args.rate else None
        scales = positive_numbers(args.load, "--load")
        names = sorted({m.name for m in old.config.models} | {m.name for m in new.config.models})
        requests = read_requests(args.replay, names, args.seed) if args.replay else []
        doc = what_if(old, new, requests, rates, scales)
    except (OSError, ValueError) as exc:
        print(f"enginegate config diff: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return 0


def add_parser(config_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``diff`` under ``enginegate config``."""
    p = config_sub.add_parser(
        "diff", help="what NEW changes against OLD: settings by name and, over a request log or trace, where "
        "routing decisions move and what the simulator predicts under each",
    )  # fmt: skip
    p.add_argument("old", type=Path, help="the running config")
    p.add_argument("new", type=Path, help="the config you would reload")
    p.add_argument(
        "--replay", type=Path, metavar="REQUEST_LOG|TRACE",
        help="the gateway's JSON request log (its lines with msg \"request\"), or a trace the simulator reads",
    )  # fmt: skip
    p.add_argument("--rate", help="request rates to simulate, requests/s, e.g. 5,10,20 (default: see --load)")
    p.add_argument("--load", default="1,2,4", help="multiples of the logged request rate to simulate (default: 1,2,4)")
    p.add_argument("--seed", type=int, default=0, help="models and budgets drawn for a trace's requests (default: 0)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (as POST /admin/config/diff)")
    p.set_defaults(func=run)

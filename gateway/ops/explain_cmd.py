"""``enginegate route explain``: where a hypothetical request would go and why, from the config alone."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gateway.ops.common import load_or_report


def _explain(args: argparse.Namespace) -> int:
    """Where would this request go and why, against the config file (every backend healthy and idle)."""
    from gateway.fleet.catalog import model_specs, profile
    from gateway.fleet.catalog import rules as build_rules
    from routing.explain import render
    from routing.policy import choose
    from routing.types import BackendState, FleetSnapshot, RequestFeatures

    loaded = load_or_report(args.config)
    if loaded is None:
        return 1
    from gateway.fleet.catalog import capabilities
    from gateway.fleet.engines import configured_capabilities

    snapshot = FleetSnapshot(
        tuple(
            BackendState(profile(b, loaded, caps=capabilities(configured_capabilities(b), b, loaded.model(b.model))))
            for b in loaded.config.backends
        ),
        model_specs(loaded),
    )
    features = RequestFeatures(
        needs=frozenset(args.needs or ()),
        extras=frozenset(args.extra or ()),
        model=args.model,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        ttft_budget_ms=args.ttft_budget_ms,
        latency_budget_ms=args.latency_budget_ms,
        tpot_budget_ms=args.tpot_budget_ms,
        tenant=args.tenant,
        key=args.key,
        team=args.team,
        headers=tuple((k.lower(), v) for k, _, v in (h.partition("=") for h in args.header)),
    )
    print(render(choose(features, snapshot, build_rules(loaded)), features, snapshot))
    return 0


def add_parser(sub: Any, default_config: Path) -> Any:
    """``route`` and ``route explain``; returns the ``route`` subparsers."""
    route = sub.add_parser("route", help="inspect routing")
    route_sub = route.add_subparsers(dest="route_command", required=True)
    explain = route_sub.add_parser("explain", help="rank the backends for a hypothetical request and say why")
    explain.add_argument("--config", type=Path, default=default_config)
    explain.add_argument("--model", required=True)
    explain.add_argument("--prompt-tokens", type=int, default=100)
    explain.add_argument("--max-tokens", type=int, default=None)
    explain.add_argument("--ttft-budget-ms", type=float, default=None)
    explain.add_argument("--latency-budget-ms", type=float, default=None)
    explain.add_argument("--tpot-budget-ms", type=float, default=None)
    explain.add_argument("--tenant", default=None)
    explain.add_argument("--key", default=None, help="an API key's id (rules matching keys)")
    explain.add_argument("--team", default=None, help="an API key's team (rules matching teams)")
    explain.add_argument(
        "--needs", action="append", default=[], metavar="CAPABILITY",
        help="a capability the request uses (tools, json_schema, logprobs, images...); repeatable",
    )  # fmt: skip
    explain.add_argument(
        "--extra", action="append", default=[], metavar="FIELD",
        help="a request field outside OpenAI's spec (top_k, min_p...); repeatable",
    )  # fmt: skip
    explain.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    explain.set_defaults(func=_explain)
    return route_sub

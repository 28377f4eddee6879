"""``enginegate route explain``: where a hypothetical request would go and why, from the config alone
(every backend healthy and idle), through the same ``choose`` and the same explanation as the live
``POST /admin/route/explain``.

The exit status makes it a gate in CI: 0 when a backend is chosen, ``EXIT_NOTHING_FITS`` when every
backend serving the model is too small for the request, ``EXIT_NO_BACKEND`` when no backend serves the
model (or it is unknown), ``EXIT_REFUSED`` for the other refusals (a capability no backend has, a
strict budget none meets). 1 is a config problem, 2 a usage error (argparse's).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.ops.common import load_or_report

if TYPE_CHECKING:
    from gateway.config import LoadedConfig
    from routing.decisions import Decision
    from routing.rules import Rules
    from routing.types import FleetSnapshot, RequestFeatures

EXIT_NOTHING_FITS = 3
EXIT_NO_BACKEND = 4
EXIT_REFUSED = 5
_CHOSEN = frozenset({"meets_budget", "no_budget", "best_effort"})


def exit_code(decision: Decision) -> int:
    reason = decision.reason.value
    if reason in _CHOSEN:
        return 0
    return {"nothing_fits": EXIT_NOTHING_FITS, "no_backend_for_model": EXIT_NO_BACKEND}.get(reason, EXIT_REFUSED)


def idle_fleet(loaded: LoadedConfig) -> FleetSnapshot:
    """The config's backends as routing sees them, every one healthy and idle."""
    from gateway.fleet.catalog import capabilities, model_specs, profile
    from gateway.fleet.engines import configured_capabilities
    from routing.types import BackendState, FleetSnapshot

    return FleetSnapshot(
        tuple(
            BackendState(profile(b, loaded, caps=capabilities(configured_capabilities(b), b, loaded.model(b.model))))
            for b in loaded.config.backends
        ),
        model_specs(loaded),
    )


def _features(args: argparse.Namespace, prompt_tokens: int) -> RequestFeatures:
    from routing.types import RequestFeatures

    return RequestFeatures(
        needs=frozenset(args.needs or ()),
        extras=frozenset(args.extra or ()),
        model=args.model,
        prompt_tokens=prompt_tokens,
        max_tokens=args.max_tokens,
        ttft_budget_ms=args.ttft_budget_ms,
        latency_budget_ms=args.latency_budget_ms,
        tpot_budget_ms=args.tpot_budget_ms,
        tenant=args.tenant,
        key=args.key,
        team=args.team,
        headers=tuple((k.lower(), v) for k, _, v in (h.partition("=") for h in args.header)),
    )


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected token counts such as 1000,8000,32000") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive token counts such as 1000,8000,32000")
    return lengths


def _explain(args: argparse.Namespace) -> int:
    """Where would this request go and why, against the config file (every backend healthy and idle)."""
    import json

    from gateway.config.fallbacks import aliases_of, chains_of
    from gateway.fleet.catalog import rules as build_rules
    from routing import fallback
    from routing.explain import explained, to_dict
    from routing.split import route

    loaded = load_or_report(args.config)
    if loaded is None:
        return 1
    snapshot, rules = idle_fleet(loaded), build_rules(loaded)
    base = _features(args, args.prompt_tokens[0])
    base = replace(base, model=aliases_of(loaded.config.models).get(base.model, base.model))
    chains = chains_of(loaded.config.models)
    runs = [(f, route(f, snapshot, rules)) for f in (replace(base, prompt_tokens=n) for n in args.prompt_tokens)]
    known = sorted(snapshot.models)
    if base.model not in snapshot.models:
        print(f"unknown model {args.model!r} (known: {', '.join(known)})", file=sys.stderr)
    if args.json:
        docs = [
            to_dict(d, f, rules)
            | {"fallbacks": fallback.to_dicts(d, fallback.planned(f, snapshot, rules, chains.get(f.model, ())))}
            | _unknown(base.model, known)
            for f, d in runs
        ]
        print(json.dumps(docs[0] if len(docs) == 1 else {"sweep": docs}, indent=2))
    elif len(runs) == 1:
        print(explained(runs[0][1], runs[0][0], snapshot, rules, chains))
    else:
        from gateway.ops.sweep import table

        print(table(runs, snapshot))
    if args.plot is not None:
        code = _plot(args, runs, snapshot, rules)
        if code:
            return code
    return max(_rescued(f, d, snapshot, rules, chains) for f, d in runs)


def _rescued(
    f: RequestFeatures, decision: Decision, snapshot: FleetSnapshot, rules: Rules, chains: Mapping[str, Sequence[Any]]
) -> int:
    """``exit_code``, but 0 when the model's fallback chain has a step that would take the request."""
    from routing import fallback

    code = exit_code(decision)
    cause = fallback.decision_cause(decision)
    if code == 0 or cause is None:
        return code
    plan = fallback.planned(f, snapshot, rules, fallback.next_steps(chains.get(f.model, ()), cause))
    taken = any(fallback.decision_cause(d) is None and d.candidates for _, d in plan)
    return 0 if taken else code


def _unknown(model: str, known: list[str]) -> dict[str, Any]:
    return {} if model in known else {"known_models": known}


def _plot(args: argparse.Namespace, runs: list[tuple[RequestFeatures, Decision]], snapshot: FleetSnapshot,
          rules: Rules) -> int:  # fmt: skip
    from gateway.ops.sweep import plot

    try:
        plot(runs, snapshot, args.plot, f"{args.model} on {args.config.name}")
    except ImportError:
        print("--plot needs matplotlib: pip install 'enginegate[sim]'", file=sys.stderr)
        return 1
    print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def add_parser(sub: Any, default_config: Path) -> Any:
    """``route`` and ``route explain``; returns the ``route`` subparsers."""
    route = sub.add_parser("route", help="inspect routing")
    route_sub = route.add_subparsers(dest="route_command", required=True)
    explain = route_sub.add_parser(
        "explain", help="rank the backends for a hypothetical request and say why",
        epilog=f"exit status: 0 a backend is chosen; {EXIT_NOTHING_FITS} nothing_fits; {EXIT_NO_BACKEND} "
        f"no_backend_for_model (or an unknown model); {EXIT_REFUSED} another refusal; 1 a config problem",
    )  # fmt: skip
    explain.add_argument("--config", type=Path, default=default_config, help="the config file")
    explain.add_argument("--model", required=True, help="the model the request names")
    explain.add_argument(
        "--prompt-tokens", type=_lengths, default="100", metavar="N[,N...]",
        help="prompt tokens; several (1000,8000,32000) give a table of each backend's predictions per length",
    )  # fmt: skip
    explain.add_argument("--max-tokens", type=int, default=None, help="the request's max_tokens (default: unset)")
    explain.add_argument("--ttft-budget-ms", type=float, default=None, help="time-to-first-token budget it states")
    explain.add_argument("--latency-budget-ms", type=float, default=None, help="end-to-end budget it states")
    explain.add_argument("--tpot-budget-ms", type=float, default=None, help="time-per-output-token budget it states")
    explain.add_argument("--tenant", default=None, help="its tenant (rules matching tenants)")
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
    explain.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="a request header (rules matching headers)"
    )
    explain.add_argument(
        "--json", action="store_true", help="print the decision as JSON (as POST /admin/route/explain answers)"
    )
    explain.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw predicted TTFT against prompt length per backend"
    )
    explain.set_defaults(func=_explain)
    return route_sub

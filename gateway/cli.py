"""The ``enginegate`` command: ``serve`` and ``config check``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gateway.config import ConfigError, LoadedConfig, load_config


def default_config() -> Path:
    """$ENGINEGATE_CONFIG, else the repository's embedded default next to this package."""
    env = os.environ.get("ENGINEGATE_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def _load(path: Path) -> LoadedConfig | None:
    """The config, or None after printing every problem with its file and line."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return None


def _check(args: argparse.Namespace) -> int:
    loaded = _load(args.file)
    if loaded is None:
        return 1
    cfg = loaded.config
    print(f"{args.file}: ok ({len(cfg.models)} models, {len(cfg.backends)} backends)")
    return 0


def _explain(args: argparse.Namespace) -> int:
    """Where would this request go and why, against the config file (every backend healthy and idle)."""
    from gateway.catalog import model_specs, profile
    from gateway.catalog import rules as build_rules
    from routing.explain import render
    from routing.policy import choose
    from routing.types import BackendState, FleetSnapshot, RequestFeatures

    loaded = _load(args.config)
    if loaded is None:
        return 1
    snapshot = FleetSnapshot(
        tuple(BackendState(profile(b, loaded)) for b in loaded.config.backends), model_specs(loaded)
    )
    features = RequestFeatures(
        model=args.model,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        ttft_budget_ms=args.ttft_budget_ms,
        latency_budget_ms=args.latency_budget_ms,
        tpot_budget_ms=args.tpot_budget_ms,
        tenant=args.tenant,
        headers=tuple((k.lower(), v) for k, _, v in (h.partition("=") for h in args.header)),
    )
    print(render(choose(features, snapshot, build_rules(loaded)), features, snapshot))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.logs import configure

    configure(args.log_level, args.log_format)
    loaded = _load(args.config)
    if loaded is None:
        return 1
    try:
        app = create_app(loaded)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    server = loaded.config.server
    uvicorn.run(
        app,
        host=args.host or server.host,
        port=server.port if args.port is None else args.port,
        log_level=args.log_level,
        log_config=None,  # keep the handler configured above (JSON by default)
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enginegate", description="Multi-engine LLM serving gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--config", type=Path, default=default_config())
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", default="json", choices=["json", "text"])
    serve.set_defaults(func=_serve)
    config = sub.add_parser("config", help="work with config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file and exit non-zero on errors")
    check.add_argument("file", type=Path)
    check.set_defaults(func=_check)
    route = sub.add_parser("route", help="inspect routing")
    route_sub = route.add_subparsers(dest="route_command", required=True)
    explain = route_sub.add_parser("explain", help="rank the backends for a hypothetical request and say why")
    explain.add_argument("--config", type=Path, default=default_config())
    explain.add_argument("--model", required=True)
    explain.add_argument("--prompt-tokens", type=int, default=100)
    explain.add_argument("--max-tokens", type=int, default=None)
    explain.add_argument("--ttft-budget-ms", type=float, default=None)
    explain.add_argument("--latency-budget-ms", type=float, default=None)
    explain.add_argument("--tpot-budget-ms", type=float, default=None)
    explain.add_argument("--tenant", default=None)
    explain.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    explain.set_defaults(func=_explain)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

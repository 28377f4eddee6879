"""The ``enginegate`` command: serve, epp, config check, route explain, simulate, keys and shadow report."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import ConfigError, LoadedConfig, default_config, load_config

if TYPE_CHECKING:
    from routing.sim.simulate import SimFleet


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
    warnings = context_warnings(loaded)
    if args.probe:
        import asyncio

        warnings += asyncio.run(probe_contexts(loaded))
    for line in warnings:
        print(f"{args.file}: warning: {line}", file=sys.stderr)
    return 0


def _smaller_context(backend: str, model: str, engine: int, entry: int, why: str) -> str:
    return (
        f"backend {backend}: a context of {engine} tokens ({why}), smaller than model {model}'s {entry}: "
        f"prompt and answer there get {engine} tokens (set models[].context to {engine}, or give the engine more)"
    )


def context_warnings(loaded: LoadedConfig) -> list[str]:
    """Backends whose context is known from the config alone to be smaller than their model entry's:
    the in-process engines' ``n_ctx`` and their GGUF's own context."""
    from gateway.config import CTranslate2Config, LlamaCppConfig
    from gateway.fleet.catalog import model_specs

    specs = model_specs(loaded, loaded.ggufs)
    out = []
    for b in loaded.config.backends:
        model = loaded.model(b.model)
        if model.kind != "generate" or not isinstance(b, CTranslate2Config | LlamaCppConfig) or model.gguf is None:
            continue
        own, why = loaded.ggufs.header(loaded.resolve(model.gguf)).context_length, "its GGUF's"
        if isinstance(b, LlamaCppConfig) and b.n_ctx is not None and b.n_ctx < own:
            own, why = b.n_ctx, "its n_ctx"
        if own < specs[b.model].context:
            out.append(_smaller_context(b.name, b.model, own, specs[b.model].context, why))
    return out


async def probe_contexts(loaded: LoadedConfig) -> list[str]:
    """Ask each engine reached over HTTP what context it was launched with (vLLM, TGI, llama-server
    publish it): the ones smaller than their model entry's, and the ones that could not be asked."""
    import asyncio

    from backends.http_base import HttpBackend
    from gateway.config import CTranslate2Config, LlamaCppConfig
    from gateway.fleet.catalog import model_specs
    from gateway.fleet.engines import build_backend

    specs = model_specs(loaded, loaded.ggufs)

    async def one(cfg: Any) -> str | None:
        try:
            backend = build_backend(cfg, loaded)
        except ConfigError as exc:
            return f"backend {cfg.name}: not probed: {'; '.join(exc.problems)}"
        if not isinstance(backend, HttpBackend) or backend.context_path is None:
            await backend.aclose()
            return None  # it publishes no context (trtllm-serve, Triton, MII): learned from refusals at runtime
        try:
            health = await backend.health()
            engine = backend.context_length
        finally:
            await backend.aclose()
        if not health.ok:
            return f"backend {cfg.name}: not probed: {cfg.url} is unreachable or unhealthy ({health.detail[:120]})"
        entry = specs[cfg.model].context
        if engine is not None and engine < entry:
            return _smaller_context(cfg.name, cfg.model, engine, entry, f"what the engine at {cfg.url} publishes")
        return None

    http = [
        b
        for b in loaded.config.backends
        if not isinstance(b, CTranslate2Config | LlamaCppConfig) and loaded.model(b.model).kind == "generate"
    ]
    found = await asyncio.gather(*(one(b) for b in http))
    return [line for line in found if line is not None]


def _explain(args: argparse.Namespace) -> int:
    """Where would this request go and why, against the config file (every backend healthy and idle)."""
    from gateway.fleet.catalog import model_specs, profile
    from gateway.fleet.catalog import rules as build_rules
    from routing.explain import render
    from routing.policy import choose
    from routing.types import BackendState, FleetSnapshot, RequestFeatures

    loaded = _load(args.config)
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


def sim_fleet(loaded: LoadedConfig, outages: list[str] | None = None) -> SimFleet:
    """The config's backends, models and routing rules as the simulator's fleet (polled like the gateway)."""
    from gateway.fleet.catalog import model_specs, profile, rules
    from routing.sim.simulate import Outage, SimFleet

    parsed = []
    names = {b.name for b in loaded.config.backends}
    for text in outages or []:
        name, start, end = [*text.rsplit(":", 2), "", ""][:3]
        try:
            outage = Outage(name, float(start), float(end))
        except ValueError:
            raise ValueError(f"--outage {text!r}: expected BACKEND:START_S:END_S") from None
        if name not in names or not outage.end_s > outage.start_s >= 0:
            raise ValueError(f"--outage {text!r}: unknown backend or empty interval")
        parsed.append(outage)
    return SimFleet(
        profiles=tuple(profile(b, loaded) for b in loaded.config.backends),
        models=model_specs(loaded),
        rules=rules(loaded),
        poll_s=loaded.config.limits.health_interval_s,
        outages=tuple(parsed),
    )


def _simulate(args: argparse.Namespace) -> int:
    """Replay a trace through every routing policy on the config's fleet and compare them."""
    from routing.sim import report
    from routing.sim.sweep import parse_shares, sweep
    from routing.sim.traces import load_trace
    from routing.sim.workload import DEFAULT_MIX, parse_mix

    loaded = _load(args.config)
    if loaded is None:
        return 1
    try:
        fleet = sim_fleet(loaded, args.outage)
        rows = load_trace(args.trace)
        mix = parse_mix(args.mix) if args.mix else DEFAULT_MIX
        names = [m.name for m in loaded.config.models]
        shares = parse_shares(args.models) if args.models else [(n, 1 / len(names)) for n in names]
        loads = [float(x) / 100 for x in args.load.split(",")]
        capacity, points = sweep(
            fleet, rows, loads, shares, mix=mix, seed=args.seed, duration_s=args.duration,
            progress=lambda line: print(line, file=sys.stderr),
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        print(f"enginegate simulate: {exc}", file=sys.stderr)
        return 1
    print(f"{args.trace}: fleet capacity about {capacity:.2f} requests/s on this workload")
    print(report.text(points))
    print("\nBusy share of each backend (above 100%: work still draining after the last arrival):")
    print(report.utilization(points))
    if args.plot:
        try:
            report.plot(points, args.plot, f"{args.trace.name} on {args.config.name}")
        except ImportError:
            print("--plot needs matplotlib: pip install 'enginegate[sim]'", file=sys.stderr)
            return 1
        print(f"plot: {args.plot}")
    return 0


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.http.drain import SETTLE_S, attach
    from gateway.http.limits import raise_fd_limit
    from gateway.http.protocol import GatewayHttpProtocol
    from gateway.telemetry.logs import configure

    configure(args.log_level, args.log_format)
    loaded = _load(args.config)
    if loaded is None:
        return 1
    if args.workers < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return 1
    if args.workers > 1 and loaded.config.auth.enabled and not loaded.config.redis.url:
        print("warning: API key limits are counted per worker without redis.url", file=sys.stderr)
    if args.workers > 1 and loaded.config.admin.port is not None:
        print("admin.port is served by one process only: use --workers 1, or no admin.port", file=sys.stderr)
        return 1
    server = loaded.config.server
    raise_fd_limit(server.max_connections)  # before the workers start: they inherit it
    options: dict[str, Any] = {
        "host": args.host or server.host,
        "port": server.port if args.port is None else args.port,
        "log_level": args.log_level,
        "log_config": None,  # keep the handler configured above (JSON by default)
        "access_log": False,
        "lifespan": "on",
        "http": GatewayHttpProtocol,  # header, body, idle, connection and slow-reader limits (server:)
        "ws": "none",
        # uvicorn would take X-Forwarded-For from any loopback peer as the client's address (a client
        # beside the gateway, or any client behind a local proxy, then names itself, and the admin
        # lockout counts whatever it names): the gateway reads it itself (server.trusted_proxies).
        "proxy_headers": False,
        "timeout_keep_alive": server.keep_alive_timeout_s,
        # gateway/http/drain.py ends requests at the grace's end; uvicorn's own timeout is only the backstop.
        "timeout_graceful_shutdown": server.shutdown_grace_s + SETTLE_S,
    }
    if args.workers == 1:
        try:
            app = create_app(loaded)
        except ConfigError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            return 1
        # Loaded by the server (a factory), so the drain takes over uvicorn's signal handling.
        uv_config = uvicorn.Config(lambda: attach(app), factory=True, **options)
        runner = uvicorn.Server(uv_config)
        admin_port = loaded.config.admin.port
        # admin.port: a second listener on the same server; the admin routes answer only there.
        runner.run(sockets=[uv_config.bind_socket(), _listener(options["host"], admin_port)] if admin_port else None)
        return 0 if runner.started else 3
    # Several processes: each builds its own app from the environment, and metrics go through
    # prometheus-client's shared directory so that /metrics counts every worker's requests.
    from gateway.telemetry.metrics import MULTIPROCESS_ENV

    shared = os.environ.get(MULTIPROCESS_ENV)
    directory = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="enginegate-metrics-"))
    for stale in directory.glob("*.db"):  # values of an earlier run must not be added to this one
        stale.unlink()
    os.environ |= {
        MULTIPROCESS_ENV: str(directory),
        "ENGINEGATE_CONFIG": str(args.config.resolve()),
        "ENGINEGATE_LOG_LEVEL": args.log_level,
        "ENGINEGATE_LOG_FORMAT": args.log_format,
    }
    from gateway.http import supervisor

    config = uvicorn.Config("gateway.app:worker_app", factory=True, workers=args.workers, **options)
    supervisor.run(config, server.drain_delay_s)
    return 0


def _epp(args: argparse.Namespace) -> int:
    """The routing policy as an Envoy external processor: an Inference Extension endpoint picker."""
    import asyncio

    from gateway.telemetry.logs import configure

    configure(args.log_level, args.log_format)
    loaded = _load(args.config)
    if loaded is None:
        return 1
    try:
        from gateway.epp.server import run
    except ImportError as exc:
        print(f"enginegate epp needs gRPC and Envoy's protos: pip install 'enginegate[epp]' ({exc})", file=sys.stderr)
        return 1
    ports = [args.port] if args.health_port is None else [args.port, args.health_port]
    try:
        asyncio.run(run(loaded, args.host, ports))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
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
    serve.add_argument("--workers", type=int, default=1, help="worker processes (metrics are shared)")
    serve.set_defaults(func=_serve)
    epp = sub.add_parser("epp", help="pick endpoints for a Kubernetes inference gateway (Envoy ext_proc, gRPC)")
    epp.add_argument("--config", type=Path, required=True, help="models and backends; each backend url is an endpoint")
    epp.add_argument("--host", default="0.0.0.0")
    epp.add_argument("--port", type=int, default=9002, help="the ExternalProcessor and gRPC health")
    epp.add_argument("--health-port", type=int, help="the same services on a second port (the reference's 9003)")
    epp.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    epp.add_argument("--log-format", default="json", choices=["json", "text"])
    epp.set_defaults(func=_epp)
    config = sub.add_parser("config", help="work with config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file and exit non-zero on errors")
    check.add_argument("file", type=Path)
    check.add_argument(
        "--probe",
        action="store_true",
        help="also ask each engine reached over HTTP for the context it was launched with, and warn where "
        "it is smaller than the model entry's",
    )
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
    simulate = sub.add_parser("simulate", help="replay a trace through every routing policy and compare them")
    simulate.add_argument("--config", type=Path, default=default_config(), help="the fleet (a gateway config)")
    simulate.add_argument("--trace", type=Path, required=True, help="Azure LLM trace CSV, or CSV/JSONL")
    simulate.add_argument("--load", default="50,80,100,120", help="offered loads, %% of fleet capacity")
    simulate.add_argument("--models", help="model shares, e.g. llama-3.1-8b:0.8,llama-3.1-70b:0.2 (default: equal)")
    simulate.add_argument("--mix", help="budget classes, e.g. chat:0.7:ttft=500,batch:0.3:e2e=60000")
    simulate.add_argument("--duration", type=float, help="simulated seconds to replay (default: whole trace)")
    simulate.add_argument("--outage", action="append", metavar="BACKEND:START_S:END_S", help="take a backend down")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--plot", type=Path, help="write a PNG of attainment against load")
    simulate.set_defaults(func=_simulate)
    from gateway.tenancy import commands as keys_commands

    keys_commands.add_parser(sub, default_config())
    from gateway.telemetry import shadow_report

    shadow_report.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

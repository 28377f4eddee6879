"""The ``enginegate`` command: serve, epp, config, route explain, simulate, keys and shadow report."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, LoadedConfig, ServerConfig, default_config
from gateway.ops import config_cmd, diff_cmd, explain_cmd, simulate_cmd
from gateway.ops.common import load_or_report


def _load(path: Path) -> LoadedConfig | None:
    return load_or_report(path)


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
    from gateway.http.drain import attach
    from gateway.http.limits import raise_fd_limit, tune_gc
    from gateway.telemetry.logs import configure

    configure(args.log_level, args.log_format)
    loaded = _load(args.config)
    if loaded is None:
        return 1
    # Served all the same: the estimate rests on catalog figures (and a guessed size where params_b is
    # unset), and the fleet's other backends still serve; `config check` refuses the file.
    from gateway.fleet.placement import placement_problems

    for problem in placement_problems(loaded)[0]:
        logging.getLogger("enginegate.fleet").error("%s", problem)
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
    options = _uvicorn_options(args, server)
    if args.workers == 1:
        try:
            app = create_app(loaded)
        except ConfigError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            return 1
        tune_gc()
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


def _uvicorn_options(args: argparse.Namespace, server: ServerConfig) -> dict[str, Any]:
    """uvicorn's settings for `serve`: the gateway's own protocol, logging and limits."""
    from gateway.http.drain import SETTLE_S
    from gateway.http.protocol import GatewayHttpProtocol

    return {
        "host": args.host or server.host,
        "port": server.port if args.port is None else args.port,
        "log_level": args.log_level,
        "log_config": None,  # keep the handler configured above (JSON by default)
        "access_log": False,
        "server_header": False,  # no `server: uvicorn`: what runs behind the door is nobody's business
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


class _WithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every --help shows each option's default, where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "(default" in (action.help or ""):
            return action.help  # none worth showing, or the help says it in its own words
        return super()._get_help_string(action)


def _log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    parser.add_argument(
        "--log-format", default="json", choices=["json", "text"],
        help="one JSON object per line, or text with the same fields as key=value",
    )  # fmt: skip


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """This parser and every subcommand's, depth first."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += parsers(child)
    return found


def build_parser() -> argparse.ArgumentParser:
    """``enginegate`` and every subcommand, each option with its help and default."""
    from gateway.telemetry.metrics import version

    parser = argparse.ArgumentParser(prog="enginegate", description="Multi-engine LLM serving gateway.")
    parser.add_argument(
        "--version", action="version", version=f"enginegate {version()} (Python {platform.python_version()})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--config", type=Path, default=default_config(), help="the config file ($ENGINEGATE_CONFIG)")
    serve.add_argument("--host", help="address to listen on (default: the config's server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (default: the config's server.port)")
    _log_options(serve)
    serve.add_argument("--workers", type=int, default=1, help="worker processes (metrics are shared)")
    serve.set_defaults(func=_serve)
    epp = sub.add_parser("epp", help="pick endpoints for a Kubernetes inference gateway (Envoy ext_proc, gRPC)")
    epp.add_argument("--config", type=Path, required=True, help="models and backends; each backend url is an endpoint")
    epp.add_argument("--host", default="0.0.0.0", help="address to listen on")
    epp.add_argument("--port", type=int, default=9002, help="the ExternalProcessor and gRPC health")
    epp.add_argument("--health-port", type=int, help="the same services on a second port (the reference's 9003)")
    _log_options(epp)
    epp.set_defaults(func=_epp)
    diff_cmd.add_parser(config_cmd.add_parser(sub))
    explain_cmd.add_parser(sub, default_config())
    simulate_cmd.add_parser(sub, default_config())
    from gateway.tenancy import commands as keys_commands

    keys_commands.add_parser(sub, default_config())
    from gateway.telemetry import shadow_report

    shadow_report.add_parser(sub)
    for each in parsers(parser):
        each.formatter_class = _WithDefaults
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

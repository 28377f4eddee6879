"""The ``enginegate`` command: ``serve`` and ``config check``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from gateway.config import ConfigError, load_config


def default_config() -> Path:
    """$ENGINEGATE_CONFIG, else the repository's embedded default next to this package."""
    env = os.environ.get("ENGINEGATE_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def _check(args: argparse.Namespace) -> int:
    try:
        loaded = load_config(args.file)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    cfg = loaded.config
    print(f"{args.file}: ok ({len(cfg.models)} models, {len(cfg.backends)} backends)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        loaded = load_config(args.config)
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
    serve.set_defaults(func=_serve)
    config = sub.add_parser("config", help="work with config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file and exit non-zero on errors")
    check.add_argument("file", type=Path)
    check.set_defaults(func=_check)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

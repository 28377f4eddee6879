"""``enginegate config check|show|schema``: validate a config file (its schema, then every backend's
placement, then the engines' contexts), print it with its defaults, print its JSON schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, LoadedConfig
from gateway.ops.common import load_or_report


def _check(args: argparse.Namespace) -> int:
    loaded = load_or_report(args.file)
    if loaded is None:
        return 1
    from gateway.fleet.placement import placement_problems

    cfg = loaded.config
    errors, placement_warnings = placement_problems(loaded)
    for line in errors:
        print(line, file=sys.stderr)
    if errors:
        return 1
    print(f"{args.file}: ok ({len(cfg.models)} models, {len(cfg.backends)} backends)")
    warnings = context_warnings(loaded)
    if args.probe:
        import asyncio

        warnings += asyncio.run(probe_contexts(loaded))
    for line in placement_warnings:
        print(line, file=sys.stderr)
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


def _show(args: argparse.Namespace) -> int:
    """The file as the gateway reads it: every key, defaults filled in, in the file's own order."""
    import yaml

    loaded = load_or_report(args.file)
    if loaded is None:
        return 1
    doc = loaded.config.model_dump(mode="json")
    print(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120), end="")
    return 0


def schema() -> dict[str, Any]:
    """The config file's JSON schema: the same pydantic models (and attribute docstrings) the docs'
    configuration reference is generated from."""
    from gateway.config import GatewayConfig

    doc = GatewayConfig.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **doc, "title": "enginegate config"}


def _schema(args: argparse.Namespace) -> int:
    import json

    print(json.dumps(schema(), indent=2))
    return 0


def add_parser(sub: Any) -> Any:
    """``config`` and its subcommands; returns the ``config`` subparsers, for commands added beside them."""
    config = sub.add_parser("config", help="work with config files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file and exit non-zero on errors")
    check.add_argument("file", type=Path, help="the config file")
    check.add_argument(
        "--probe",
        action="store_true",
        help="also ask each engine reached over HTTP for the context it was launched with, and warn where "
        "it is smaller than the model entry's",
    )
    check.set_defaults(func=_check)
    show = config_sub.add_parser("show", help="print the config as the gateway reads it, defaults included (YAML)")
    show.add_argument("file", type=Path, help="the config file")
    show.set_defaults(func=_show)
    config_sub.add_parser("schema", help="print the config file's JSON schema").set_defaults(func=_schema)
    return config_sub

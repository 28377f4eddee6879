"""``enginegate keys create|list|show|update|revoke|usage|hash``: against the key database directly.

The database is the config's ``auth.database`` (default ``keys.db`` beside the config file) or
``--database`` (a SQLite path or a ``postgresql://`` DSN). A created key is printed once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.tenancy.keys import KeyRecord, digest, key_id_of
from gateway.tenancy.manage import BadKeySpec, create, revoke, summarize, update, validate
from gateway.tenancy.pricing import day_of
from gateway.tenancy.settings import DEFAULT_CLASSES
from gateway.tenancy.store import KeyStore, open_store

_LIMIT_OPTIONS = (
    ("--name", str, "who the key is for"),
    ("--team", str, "the team it is charged to"),
    ("--models", str, "comma-separated model globs it may use (default: all)"),
    ("--rpm", int, "requests per minute (0: unlimited)"),
    ("--tpm", int, "tokens per minute, prompt and completion (0: unlimited)"),
    ("--concurrency", int, "requests at once (0: unlimited)"),
    ("--budget-usd", float, "spend per period in dollars (0: unlimited)"),
    ("--budget-period", str, "day or month"),
    ("--priority", str, "priority class (auth.priority_classes)"),
    ("--expires-at", float, "unix seconds after which the key is refused"),
)


_ID = "the key's id (8 hex digits, as keys list shows it)"


def add_parser(sub: Any, default_config: Path) -> None:
    keys = sub.add_parser("keys", help="manage API keys (in the key database)")
    keys.add_argument("--config", type=Path, default=default_config, help="the config file (its auth.database)")
    keys.add_argument("--database", help="SQLite file or postgresql:// DSN (default: the config's auth.database)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    for name, help_text in (("create", "create a key and print it (once)"), ("update", "change a key's limits")):
        p = keys_sub.add_parser(name, help=help_text)
        if name == "update":
            p.add_argument("id", help=_ID)
            p.add_argument(
                "--enable", dest="enabled", action="store_const", const=True, default=None, help="accept it again"
            )
            p.add_argument(
                "--disable", dest="enabled", action="store_const", const=False, help="refuse it (401), keeping it"
            )
        for flag, kind, text in _LIMIT_OPTIONS:
            p.add_argument(flag, type=kind, default=None, help=text)
    keys_sub.add_parser("list", help="list keys (never their secrets)")
    for name in ("show", "revoke"):
        keys_sub.add_parser(name, help=f"{name} a key").add_argument("id", help=_ID)
    usage = keys_sub.add_parser("usage", help="requests, tokens and spend by day and model")
    usage.add_argument("id", help=_ID)
    usage.add_argument("--days", type=int, default=31, help="days of usage to sum, up to today")
    hashed = keys_sub.add_parser("hash", help="the id and sha256 to declare a key in YAML (auth.keys)")
    hashed.add_argument("token", help="the key; '-' reads it from standard input")
    keys.set_defaults(func=run)


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, _, _ in _LIMIT_OPTIONS:
        attr = flag.removeprefix("--").replace("-", "_")
        value = getattr(args, attr)
        if value is not None:
            out[attr] = [m for m in value.split(",") if m] if attr == "models" else value
    if getattr(args, "enabled", None) is not None:
        out["enabled"] = args.enabled
    return out


def _print(doc: Any) -> None:
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())


def _where(args: argparse.Namespace) -> tuple[str, Path, dict[str, int]]:
    if args.database:
        return args.database, Path.cwd(), dict(DEFAULT_CLASSES)
    from gateway.config import ConfigError, load_config

    try:
        loaded = load_config(args.config)
    except ConfigError as exc:
        raise SystemExit("\n".join(exc.problems)) from None
    auth = loaded.config.auth
    return auth.database or "keys.db", loaded.path.parent, dict(auth.priority_classes)


def run(args: argparse.Namespace) -> int:
    if args.keys_command == "hash":
        token = sys.stdin.readline().strip() if args.token == "-" else args.token
        key_id = key_id_of(token)
        if key_id is None:
            print("not an enginegate key (sk-eg-...)", file=sys.stderr)
            return 1
        _print({"id": key_id, "sha256": digest(token)})
        return 0
    dsn, base, classes = _where(args)
    return asyncio.run(_run(args, dsn, base, classes))


async def _run(args: argparse.Namespace, dsn: str, base: Path, classes: dict[str, int]) -> int:
    store = await open_store(dsn, base)
    try:
        return await _command(args, store, classes)
    except BadKeySpec as exc:
        print(f"enginegate keys: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()


async def _command(args: argparse.Namespace, store: KeyStore, classes: dict[str, int]) -> int:
    command = args.keys_command
    if command == "create":
        created, token = await create(store, validate(_fields(args), classes))
        _print({"key": token, **created.public()})
        print("Store the key now: it is not shown again.", file=sys.stderr)
        return 0
    if command == "list":
        _print([r.public() for r in await store.all()])
        return 0
    record: KeyRecord | None
    if command == "update":
        record = await update(store, args.id, _fields(args), classes)
    elif command == "revoke":
        record = await revoke(store, args.id)
    else:
        record = await store.get(args.id)
    if record is None:
        print(f"enginegate keys: no key {args.id}", file=sys.stderr)
        return 1
    if command == "usage":
        since = day_of(time.time() - max(0, args.days - 1) * 86400)
        _print({"id": args.id, "since": since, **summarize(await store.usage(args.id, since))})
        return 0
    _print(record.public())
    return 0

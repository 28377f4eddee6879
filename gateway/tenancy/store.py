"""Where keys and usage live: SQLite (stdlib, a file beside the config) or PostgreSQL (asyncpg), by DSN.

Both speak the same SQL (``?`` placeholders, numbered for PostgreSQL) and the same two tables:
``keys`` (one row per key, the hash but never the token) and ``usage`` (requests, tokens and
spend per key, UTC day and model, added to in batches).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from gateway.tenancy.keys import KeyRecord

_COLUMNS = (
    "id", "sha256", "name", "team", "models", "rpm", "tpm", "concurrency", "budget_usd", "budget_period",
    "priority", "expires_at", "enabled", "created_at", "revoked_at",
)  # fmt: skip
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS keys (
        id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, name TEXT NOT NULL, team TEXT NOT NULL, models TEXT NOT NULL,
        rpm BIGINT NOT NULL, tpm BIGINT NOT NULL, concurrency BIGINT NOT NULL, budget_usd DOUBLE PRECISION NOT NULL,
        budget_period TEXT NOT NULL, priority TEXT NOT NULL, expires_at DOUBLE PRECISION, enabled BOOLEAN NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION)""",
    """CREATE TABLE IF NOT EXISTS usage (
        key_id TEXT NOT NULL, day TEXT NOT NULL, model TEXT NOT NULL, requests BIGINT NOT NULL,
        prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL, PRIMARY KEY (key_id, day, model))""",
)
_UPSERT_USAGE = """INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (key_id, day, model) DO UPDATE SET requests = usage.requests + excluded.requests,
    prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = usage.completion_tokens + excluded.completion_tokens,
    cached_tokens = usage.cached_tokens + excluded.cached_tokens, cost_usd = usage.cost_usd + excluded.cost_usd"""
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM keys"
_INSERT = f"INSERT INTO keys ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
_UPDATE = f"UPDATE keys SET {', '.join(f'{c} = ?' for c in _COLUMNS[1:])} WHERE id = ?"


@dataclass(frozen=True, slots=True)
class UsageRow:
    key_id: str
    day: str
    """UTC date, ``YYYY-MM-DD``."""
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0


class DuplicateKey(Exception):
    """A key with this id exists already."""


class KeyStore(Protocol):
    async def get(self, key_id: str) -> KeyRecord | None: ...
    async def all(self) -> list[KeyRecord]: ...
    async def insert(self, record: KeyRecord) -> None: ...
    async def update(self, record: KeyRecord) -> None: ...
    async def add_usage(self, rows: list[UsageRow]) -> None: ...
    async def usage(self, key_id: str, since_day: str = "") -> list[UsageRow]: ...
    async def close(self) -> None: ...


def _row(record: KeyRecord) -> tuple[Any, ...]:
    values = [getattr(record, c) for c in _COLUMNS]
    values[_COLUMNS.index("models")] = orjson.dumps(list(record.models)).decode()
    return tuple(values)


def _record(row: Any) -> KeyRecord:
    values = dict(zip(_COLUMNS, tuple(row), strict=True))
    values["models"] = tuple(orjson.loads(values["models"]))
    values["enabled"] = bool(values["enabled"])
    return KeyRecord(**values)


def _usage(row: Any) -> UsageRow:
    return UsageRow(*tuple(row))


class SqliteStore:
    """One connection used from worker threads (sqlite3 blocks), one statement at a time; WAL mode, so
    the CLI and a running gateway can share the file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=10, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        for statement in _SCHEMA:
            self._db.execute(statement)

    def _run(self, sql: str, args: tuple[Any, ...] = (), many: list[tuple[Any, ...]] | None = None) -> list[Any]:
        with self._lock:
            if many is not None:
                self._db.execute("BEGIN")
                try:
                    self._db.executemany(sql, many)
                finally:
                    self._db.execute("COMMIT")
                return []
            return self._db.execute(sql, args).fetchall()

    async def _call(self, sql: str, args: tuple[Any, ...] = (), many: list[tuple[Any, ...]] | None = None) -> list[Any]:
        return await asyncio.to_thread(self._run, sql, args, many)

    async def get(self, key_id: str) -> KeyRecord | None:
        rows = await self._call(f"{_SELECT} WHERE id = ?", (key_id,))
        return _record(rows[0]) if rows else None

    async def all(self) -> list[KeyRecord]:
        return [_record(r) for r in await self._call(f"{_SELECT} ORDER BY created_at")]

    async def insert(self, record: KeyRecord) -> None:
        try:
            await self._call(_INSERT, _row(record))
        except sqlite3.IntegrityError:
            raise DuplicateKey(record.id) from None

    async def update(self, record: KeyRecord) -> None:
        row = _row(record)
        await self._call(_UPDATE, (*row[1:], row[0]))

    async def add_usage(self, rows: list[UsageRow]) -> None:
        if rows:
            await self._call(_UPSERT_USAGE, many=[_usage_values(r) for r in rows])

    async def usage(self, key_id: str, since_day: str = "") -> list[UsageRow]:
        sql = "SELECT * FROM usage WHERE key_id = ? AND day >= ? ORDER BY day, model"
        return [_usage(r) for r in await self._call(sql, (key_id, since_day))]

    async def close(self) -> None:
        with self._lock:
            self._db.close()


def _usage_values(r: UsageRow) -> tuple[Any, ...]:
    return (r.key_id, r.day, r.model, r.requests, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.cost_usd)


def _numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1, $2, ...``."""
    count = iter(range(1, 10_000))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)


class PostgresStore:
    """asyncpg's pool: replicas share the keys and usage of one database."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, dsn: str) -> PostgresStore:
        import asyncpg

        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4, command_timeout=10)
        # Replicas starting together: the advisory lock keeps their CREATEs from racing.
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(7314)")
            for statement in _SCHEMA:
                await conn.execute(statement)
        return cls(pool)

    async def get(self, key_id: str) -> KeyRecord | None:
        row = await self._pool.fetchrow(_numbered(f"{_SELECT} WHERE id = ?"), key_id)
        return _record(row) if row is not None else None

    async def all(self) -> list[KeyRecord]:
        return [_record(r) for r in await self._pool.fetch(f"{_SELECT} ORDER BY created_at")]

    async def insert(self, record: KeyRecord) -> None:
        import asyncpg

        try:
            await self._pool.execute(_numbered(_INSERT), *_row(record))
        except asyncpg.UniqueViolationError:
            raise DuplicateKey(record.id) from None

    async def update(self, record: KeyRecord) -> None:
        row = _row(record)
        await self._pool.execute(_numbered(_UPDATE), *row[1:], row[0])

    async def add_usage(self, rows: list[UsageRow]) -> None:
        if rows:
            await self._pool.executemany(_numbered(_UPSERT_USAGE), [_usage_values(r) for r in rows])

    async def usage(self, key_id: str, since_day: str = "") -> list[UsageRow]:
        sql = _numbered("SELECT * FROM usage WHERE key_id = ? AND day >= ? ORDER BY day, model")
        return [_usage(r) for r in await self._pool.fetch(sql, key_id, since_day)]

    async def close(self) -> None:
        await self._pool.close()


def is_postgres(dsn: str) -> bool:
    return dsn.startswith(("postgresql://", "postgres://"))


async def open_store(dsn: str, base: Path) -> KeyStore:
    """``dsn``: a ``postgresql://`` URL, else a SQLite file path (relative to ``base``)."""
    if is_postgres(dsn):
        return await PostgresStore.connect(dsn)
    return await asyncio.to_thread(_sqlite, dsn, base)


def _sqlite(dsn: str, base: Path) -> SqliteStore:
    path = Path(dsn).expanduser()
    return SqliteStore(path if path.is_absolute() else base / path)


def unavailable() -> tuple[type[BaseException], ...]:
    """The errors that mean the store cannot be reached or is busy right now (anything else is a bug)."""
    errors: tuple[type[BaseException], ...] = (OSError, TimeoutError, sqlite3.OperationalError)
    try:
        import asyncpg
    except ImportError:
        return errors
    return (*errors, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
            asyncpg.TooManyConnectionsError)  # fmt: skip

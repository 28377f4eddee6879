"""The key store on SQLite (the embedded default) and on a real PostgreSQL: the same behaviour."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.tenancy.gate import Tenancy
from gateway.tenancy.keys import KeyRecord, digest, key_id_of
from gateway.tenancy.manage import BadKeySpec, create, revoke, summarize, update, validate
from gateway.tenancy.settings import DEFAULT_CLASSES, AuthConfig, RedisConfig
from gateway.tenancy.store import DuplicateKey, KeyStore, UsageRow, open_store
from tests.tenancy.services import Postgres


@pytest.fixture(params=["sqlite", "postgres"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return "keys.db"  # relative: beside the config (here the test's directory)
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.dsn


def run(dsn: str, base: Path, body: Callable[[KeyStore], Awaitable[None]]) -> None:
    async def go() -> None:
        store = await open_store(dsn, base)
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(go())


def test_created_keys_are_stored_hashed_and_found_by_id(dsn: str, tmp_path: Path) -> None:
    async def body(store: KeyStore) -> None:
        limits = validate({"name": "alice", "team": "red", "models": ["llama-*"], "rpm": 60}, DEFAULT_CLASSES)
        record, token = await create(store, limits)
        assert key_id_of(token) == record.id
        got = await store.get(record.id)
        assert got is not None and got.matches(token) and not got.matches(token + "x")
        assert got.sha256 == digest(token) and token not in repr(got)
        assert (got.name, got.team, got.models, got.rpm) == ("alice", "red", ("llama-*",), 60)
        assert record.id in [r.id for r in await store.all()]
        assert await store.get("00000000") is None
        with pytest.raises(DuplicateKey):
            await store.insert(KeyRecord(id=record.id, sha256="0" * 64))

    run(dsn, tmp_path, body)


def test_updates_are_validated_and_revocation_is_kept(dsn: str, tmp_path: Path) -> None:
    async def body(store: KeyStore) -> None:
        record, _ = await create(store, validate({}))
        changed = await update(store, record.id, {"tpm": 1000, "enabled": False, "priority": "low"}, DEFAULT_CLASSES)
        assert changed is not None and (changed.tpm, changed.enabled, changed.priority) == (1000, False, "low")
        with pytest.raises(BadKeySpec):
            await update(store, record.id, {"priority": "vip"}, DEFAULT_CLASSES)
        with pytest.raises(BadKeySpec):
            await update(store, record.id, {"sha256": "0" * 64}, DEFAULT_CLASSES)
        with pytest.raises(BadKeySpec):
            await update(store, record.id, {"rpm": -1}, DEFAULT_CLASSES)
        revoked = await revoke(store, record.id)
        assert revoked is not None and revoked.usable(0.0) == "revoked"
        again = await store.get(record.id)
        assert again is not None and again.revoked_at == revoked.revoked_at
        assert await update(store, "00000000", {"rpm": 1}) is None

    run(dsn, tmp_path, body)


def test_usage_rows_add_up_by_key_day_and_model(dsn: str, tmp_path: Path) -> None:
    async def body(store: KeyStore) -> None:
        record, _ = await create(store, validate({}))
        k = record.id
        await store.add_usage(
            [UsageRow(k, "2026-12-01", "a", 1, 10, 5, 2, 0.5), UsageRow(k, "2026-12-02", "b", 2, 1, 1)]
        )
        await store.add_usage([UsageRow(k, "2026-12-01", "a", 3, 30, 15, 0, 0.25)])
        rows = await store.usage(k, "2026-12-01")
        doc = summarize(rows)
        assert doc["by_model"]["a"] == {
            "requests": 4, "prompt_tokens": 40, "completion_tokens": 20, "cached_tokens": 2, "cost_usd": 0.75,
        }  # fmt: skip
        assert doc["total"]["requests"] == 6
        assert [r.day for r in await store.usage(k, "2026-12-02")] == ["2026-12-02"]

    run(dsn, tmp_path, body)


def test_usage_being_written_when_the_gateway_stops_is_written_once(dsn: str, tmp_path: Path) -> None:
    """The periodic flush is writing when the gateway stops: the stop waits for that write instead of
    cancelling it (its rows were lost: a two-replica test counted fewer requests than it paid for)."""

    async def go() -> list[UsageRow]:
        auth = AuthConfig(required=True, database=dsn, usage_flush_s=0.01)
        tenancy = Tenancy(auth, RedisConfig(), tmp_path, {}, 60.0, CollectorRegistry())
        await tenancy.start()
        store = tenancy.store
        assert store is not None
        record, _ = await create(store, validate({}))
        writing, release = asyncio.Event(), asyncio.Event()
        write = store.add_usage

        async def held(rows: list[UsageRow]) -> None:
            writing.set()
            await release.wait()
            await write(rows)

        store.add_usage = held  # type: ignore[method-assign]
        tenancy._usage[(record.id, "2026-12-01", "m")] = [3, 30, 15, 0, 0.5]  # three requests ended
        await writing.wait()  # the periodic flush took them and is writing them
        asyncio.get_running_loop().call_soon(release.set)  # the write ends once the stop is under way
        await tenancy.aclose()
        again = await open_store(dsn, tmp_path)
        try:
            return await again.usage(record.id)
        finally:
            await again.close()

    rows = asyncio.run(go())
    assert [(r.requests, r.prompt_tokens, r.cost_usd) for r in rows] == [(3, 30, 0.5)]


def test_the_keys_cli_lists_and_shows_keys_without_their_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import orjson

    from gateway.cli import main

    db = str(tmp_path / "keys.db")
    assert main(["keys", "--database", db, "create", "--name", "ci", "--models", "a*,b", "--rpm", "7"]) == 0
    created = orjson.loads(capsys.readouterr().out)
    secret = created["key"].split("_", 1)[1]
    assert main(["keys", "--database", db, "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["keys", "--database", db, "show", created["id"]]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert (shown["models"], shown["rpm"]) == (["a*", "b"], 7)
    assert created["id"] in listed and secret not in listed and "sha256" not in listed + str(shown)
    assert main(["keys", "--database", db, "update", created["id"], "--priority", "vip"]) == 1  # unknown class
    assert main(["keys", "--database", db, "show", "00000000"]) == 1

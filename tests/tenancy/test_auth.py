"""Authentication rules, in process: declared keys, placeholders with and without ``required``, the
Bearer scheme, and ``enginegate keys hash``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from gateway.http.errors import ApiError
from gateway.tenancy.gate import Tenancy
from gateway.tenancy.keys import KeyRecord, digest, key_id_of, new_token
from gateway.tenancy.settings import AuthConfig, DeclaredKey, RedisConfig
from tests.conftest import ROOT


def authenticate(auth: AuthConfig, header: str | None, base: Path) -> KeyRecord | int | None:
    """The key found, None (anonymous), or the refusal's status."""

    async def go() -> KeyRecord | int | None:
        tenancy = Tenancy(auth, RedisConfig(), base, {}, 60.0, CollectorRegistry())
        await tenancy.start()
        try:
            return await tenancy.authenticate(header)
        except ApiError as exc:
            return exc.status
        finally:
            await tenancy.aclose()

    return asyncio.run(go())


def test_tokens_carry_their_id_and_256_random_bits() -> None:
    key_id, token = new_token()
    assert token.startswith(f"sk-eg-{key_id}_") and key_id_of(token) == key_id
    assert len(token.split("_", 1)[1]) == 43  # 32 bytes, URL-safe base64
    assert new_token()[1] != token
    assert key_id_of("sk-eg-nothex00_" + "x" * 43) is None and key_id_of("unused") is None


def test_keys_declared_by_hash_in_the_config_authenticate(tmp_path: Path) -> None:
    key_id, token = new_token()
    declared = DeclaredKey(id=key_id, sha256=digest(token), team="ops", rpm=5)
    auth = AuthConfig(required=True, keys=[declared])
    found = authenticate(auth, f"Bearer {token}", tmp_path)
    assert isinstance(found, KeyRecord) and (found.team, found.rpm, found.source) == ("ops", 5, "config")
    assert authenticate(auth, f"bearer {token}", tmp_path) == found  # the scheme is case-insensitive
    assert authenticate(auth, token, tmp_path) == 401  # no scheme: not a credential
    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")  # the right id, another secret
    assert authenticate(auth, f"Bearer {forged}", tmp_path) == 401


@pytest.mark.parametrize(
    ("required", "header", "expected"),
    [(False, None, None), (False, "Bearer unused", None), (True, None, 401), (True, "Bearer unused", 401),
     (False, "Bearer sk-eg-00000000_" + "x" * 43, 401)],
)  # fmt: skip
def test_placeholders_pass_only_when_keys_are_not_required(
    required: bool, header: str | None, expected: int | None, tmp_path: Path
) -> None:
    assert authenticate(AuthConfig(required=required, database="keys.db"), header, tmp_path) == expected


def test_keys_hash_prints_what_to_declare() -> None:
    key_id, token = new_token()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "hash", "-"], input=token, capture_output=True, text=True,
        cwd=ROOT, check=True,
    )  # fmt: skip
    assert orjson.loads(done.stdout) == {"id": key_id, "sha256": digest(token)}
    assert token not in done.stderr


def test_keys_read_before_keep_working_while_the_database_is_down(tmp_path: Path) -> None:
    from gateway.tenancy.manage import create, validate

    async def go() -> tuple[object, int]:
        tenancy = Tenancy(AuthConfig(required=True, cache_s=0), RedisConfig(), tmp_path, {}, 60.0, CollectorRegistry())
        await tenancy.start()
        assert tenancy.store is not None
        try:
            record, token = await create(tenancy.store, validate({}))
            _, other = await create(tenancy.store, validate({}))
            assert await tenancy.authenticate(f"Bearer {token}") == record

            async def down(key_id: str) -> None:
                raise OSError("database unreachable")

            tenancy.store.get = down  # type: ignore[method-assign]
            still = await tenancy.authenticate(f"Bearer {token}")  # cache_s 0: read again, which fails
            try:
                await tenancy.authenticate(f"Bearer {other}")  # never read: cannot be checked
            except ApiError as exc:
                return still, exc.status
            return still, 200
        finally:
            await tenancy.aclose()

    still, status = asyncio.run(go())
    assert isinstance(still, KeyRecord) and status == 503


class _FailingStore:
    """A key store whose lookups raise ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def get(self, key_id: str) -> KeyRecord | None:
        raise self.error

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("error", [ConnectionRefusedError(111, "refused"), TimeoutError()])
def test_an_unreachable_key_store_is_a_503(tmp_path: Path, error: BaseException) -> None:
    assert lookup_with(_FailingStore(error), tmp_path) == 503


def test_a_bug_in_the_key_lookup_is_not_mistaken_for_an_unreachable_store(tmp_path: Path) -> None:
    """It propagates (the app logs its traceback and answers 500) instead of reading as "store unavailable"."""
    with pytest.raises(KeyError):
        lookup_with(_FailingStore(KeyError("models")), tmp_path)


def lookup_with(store: _FailingStore, base: Path) -> KeyRecord | int | None:
    async def go() -> KeyRecord | int | None:
        tenancy = Tenancy(AuthConfig(required=True), RedisConfig(), base, {}, 60.0, CollectorRegistry())
        tenancy.store = store  # type: ignore[assignment]
        try:
            return await tenancy.authenticate(f"Bearer {new_token()[1]}")
        except ApiError as exc:
            return exc.status

    return asyncio.run(go())

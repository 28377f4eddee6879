"""Fixtures of the tenancy tests: a real redis-server and a real PostgreSQL, one per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.abuse.probes import Engine
from tests.tenancy.services import Postgres, RedisServer


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """tests/abuse's fake engine: its own count of the streams it started shows what got through."""
    eng = Engine()
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    pg = Postgres()
    yield pg
    pg.stop()


@pytest.fixture()
def fresh_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (a test that kills it leaves the others theirs)."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture()
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that keeps its data across a stop and a start."""
    server = RedisServer(tmp_path, persistent=True)
    yield server
    server.stop()

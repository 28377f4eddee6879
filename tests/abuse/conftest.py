"""The fake engine and a gateway with short limits, shared by the probes of this directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.abuse.probes import Engine, config_text
from tests.conftest import GatewayProcess

# Short limits, so each probe runs in seconds; the defaults are the same code with other numbers.
SERVER = (
    "header_timeout_s: 1, body_timeout_s: 1, body_min_rate_bytes_s: 1024, keep_alive_timeout_s: 1, "
    "max_connections: 200, write_timeout_s: 1.5, max_output_buffer_bytes: 65536"
)


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    eng = Engine()
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def guarded(tmp_path_factory: pytest.TempPathFactory, engine: Engine, cache_dir: Path) -> Iterator[GatewayProcess]:
    """One gateway for the probes that leave it running."""
    config = tmp_path_factory.mktemp("abuse") / "gateway.yaml"
    config.write_text(config_text(engine, SERVER))
    gw = GatewayProcess(config, cache_dir)
    yield gw
    gw.stop()

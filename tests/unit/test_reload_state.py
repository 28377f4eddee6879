"""Reload keeps what did not change: the same backend objects (pools), learned estimates and breakers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.base import Backend, Load
from gateway.config import BackendConfig, LoadedConfig, load_config
from gateway.state import AppState
from tests.conftest import write_config
from tests.fakes import ScriptedBackend
from tests.polling import eventually

CONFIG = """
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: keep, engine: ctranslate2, model: m}
  - {name: change, engine: ctranslate2, model: m, max_concurrency: %d}
  - {name: drop, engine: ctranslate2, model: m}
"""


def recording(built: list[ScriptedBackend]) -> Callable[[BackendConfig, LoadedConfig], Backend]:
    """A backend factory that keeps every backend it builds in ``built``."""

    def factory(cfg: BackendConfig, loaded: LoadedConfig) -> Backend:
        built.append(ScriptedBackend(cfg.name, cfg.model))
        return built[-1]

    return factory


def test_reload_keeps_unchanged_backends_and_retires_the_rest(tmp_path: Path) -> None:
    built: list[ScriptedBackend] = []
    factory = recording(built)

    async def scenario() -> None:
        path = write_config(tmp_path / "c.yaml", CONFIG % 4)
        state = AppState(load_config(path), factory)
        keep = state.fleet.entries["keep"]
        state.fleet.accounts.succeeded(keep, 10.0, 20.0, 1.5)
        learned = keep.observed
        old_change = state.fleet.entries["change"].backend
        write_config(path, (CONFIG % 8).replace("  - {name: drop, engine: ctranslate2, model: m}\n", ""))
        assert await state.reload() == []
        assert state.fleet.entries["keep"] is keep and keep.observed == learned and learned.samples == 1
        assert state.fleet.entries["change"].backend is not old_change
        assert "drop" not in state.fleet.entries
        await eventually(lambda: built[1].closed and built[2].closed, timeout=5)  # retired ones close once idle
        assert [(b.name, b.closed) for b in built] == [
            ("keep", False),
            ("change", True),
            ("drop", True),
            ("change", False),
        ]
        write_config(path, "models: [")
        problems = await state.reload()
        assert problems and problems[0].startswith(f"{path}:")
        assert state.fleet.entries["keep"] is keep and set(state.fleet.entries) == {"keep", "change"}

    asyncio.run(scenario())


def test_a_rebuilt_backend_is_healthy_at_once_and_the_old_one_closes_after_its_last_request(tmp_path: Path) -> None:
    """In-flight counts live on the entry a request went to (issue 11.8: keyed by name, a second
    reload closed a live stream and the old pools stayed open for 600 s; new backends took 503s
    until the next poll)."""
    built: list[ScriptedBackend] = []
    factory = recording(built)

    async def scenario() -> None:
        path = write_config(tmp_path / "c.yaml", CONFIG % 4)
        state = AppState(load_config(path), factory)
        fleet = state.fleet
        first = fleet.entries["change"]
        fleet.accounts.sending(first, 10)  # a request streaming from the first build
        write_config(path, CONFIG % 8)
        assert await state.reload() == []
        second = fleet.entries["change"]
        assert second is not first and second.health.ok  # polled before it took traffic
        assert fleet.ready and "change" in {c.name for c in fleet.targets(["change"])}
        fleet.accounts.sending(second, 10)  # and one on the second build
        write_config(path, CONFIG % 16)
        assert await state.reload() == []
        one, two, three = (b for b in built if b.name == "change")
        assert not one.closed and not two.closed  # both still answering
        fleet.accounts.end(first, 10)
        fleet.accounts.end(second, 10)
        await eventually(lambda: one.closed and two.closed, timeout=5)
        assert first.in_flight == second.in_flight == 0
        assert not three.closed and fleet.entries["change"].backend is three
        await fleet.aclose()

    asyncio.run(scenario())


def test_an_engine_that_reports_waiting_requests_shows_them_as_waiting(tmp_path: Path) -> None:
    """The engine's own split wins: 10 sent, it runs 2 and queues 8 (issue 11.2: shown 10 running)."""

    class Capped(ScriptedBackend):
        async def load(self) -> Load | None:
            return Load(running=2, waiting=8)

    async def scenario() -> None:
        path = write_config(tmp_path / "c.yaml", CONFIG % 64)
        state = AppState(load_config(path), lambda cfg, loaded: Capped(cfg.name, cfg.model))
        entry = state.fleet.entries["keep"]
        for _ in range(10):
            state.fleet.accounts.sending(entry, 1)
        await state.fleet.poll_once()
        for _ in range(2):  # two more sent since the poll
            state.fleet.accounts.sending(entry, 1)
        seen = next(b for b in state.fleet.snapshot().backends if b.name == "keep")
        assert (seen.running, seen.waiting, seen.engine_slots) == (2, 10, 2)
        await state.fleet.aclose()

    asyncio.run(scenario())


class _ProbeFails(ScriptedBackend):
    """A backend whose load probe raises: an engine that is down, or a bug in the probe itself."""

    raises: BaseException = ConnectionRefusedError("connection refused")

    async def load(self) -> Load | None:
        raise self.raises


def test_a_probe_bug_is_unhealthy_with_its_traceback_and_a_down_engine_without(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    built: list[_ProbeFails] = []

    def factory(cfg: BackendConfig, loaded: LoadedConfig) -> Backend:
        built.append(_ProbeFails(cfg.name, cfg.model))
        return built[-1]

    async def scenario() -> None:
        state = AppState(load_config(write_config(tmp_path / "c.yaml", CONFIG % 4)), factory)
        keep = state.fleet.entries["keep"]
        with caplog.at_level(logging.WARNING, logger="enginegate"):
            await state.fleet.poll_entry(keep)  # the engine is down: expected, no traceback
            assert not keep.health.ok and "ConnectionRefusedError" in keep.health.detail
            assert not [r for r in caplog.records if r.exc_info]
            built[0].raises = KeyError("gauge")  # a bug in the probe: unhealthy, and its traceback logged
            await state.fleet.poll_entry(keep)
        assert not keep.health.ok and "KeyError" in keep.health.detail
        bugs = [r for r in caplog.records if r.exc_info]
        assert len(bugs) == 1 and "keep" in bugs[0].getMessage()

    asyncio.run(scenario())


def test_prefix_news_from_other_replicas_skips_in_process_engines(tmp_path: Path) -> None:
    """Every replica has its own embedded engine under the same name: another replica's prompts say
    nothing of what this replica's holds, so they are neither taken nor sent; a shared engine's are."""
    config = """
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: embedded, engine: ctranslate2, model: m}
  - {name: shared, engine: vllm, url: "http://127.0.0.1:9", model: m}
"""
    built: list[ScriptedBackend] = []

    async def scenario() -> None:
        state = AppState(load_config(write_config(tmp_path / "c.yaml", config)), recording(built))
        accounts = state.fleet.accounts
        accounts.learn("embedded", [1, 2, 3], 64.0)
        accounts.learn("shared", [1, 2, 3], 64.0)
        embedded, shared = state.fleet.entries["embedded"], state.fleet.entries["shared"]
        assert embedded.prefix is None or embedded.prefix.match([1, 2, 3]) == 0
        assert shared.prefix is not None and shared.prefix.match([1, 2, 3]) == 3

    asyncio.run(scenario())

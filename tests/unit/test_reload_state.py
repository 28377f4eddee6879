"""Reload keeps what did not change: the same backend objects (pools), learned estimates and breakers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from backends.base import Backend
from gateway.config import BackendConfig, LoadedConfig, load_config
from gateway.state import AppState
from tests.conftest import write_config
from tests.fakes import ScriptedBackend

CONFIG = """
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: keep, engine: ctranslate2, model: m}
  - {name: change, engine: ctranslate2, model: m, max_concurrency: %d}
  - {name: drop, engine: ctranslate2, model: m}
"""


def test_reload_keeps_unchanged_backends_and_retires_the_rest(tmp_path: Path) -> None:
    built: list[ScriptedBackend] = []

    def factory(cfg: BackendConfig, loaded: LoadedConfig) -> Backend:
        built.append(ScriptedBackend(cfg.name, cfg.model))
        return built[-1]

    async def scenario() -> None:
        path = write_config(tmp_path / "c.yaml", CONFIG % 4)
        state = AppState(load_config(path), factory)
        keep = state.fleet.entries["keep"]
        state.fleet.succeeded("keep", 10.0, 20.0, 1.5)
        learned = keep.observed
        old_change = state.fleet.entries["change"].backend
        write_config(path, (CONFIG % 8).replace("  - {name: drop, engine: ctranslate2, model: m}\n", ""))
        assert await state.reload() == []
        assert state.fleet.entries["keep"] is keep and keep.observed == learned and learned.samples == 1
        assert state.fleet.entries["change"].backend is not old_change
        assert "drop" not in state.fleet.entries
        await asyncio.sleep(0.2)  # retired backends close once idle
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

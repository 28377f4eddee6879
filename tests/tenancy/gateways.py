"""Gateways with API keys in front of the fake engine of tests/abuse (whose own counters show what
really reached it), and the key CLI run as users run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.abuse.probes import Engine
from tests.conftest import ROOT

# Model names pick the fake engine's pace: tok8-0 answers at once, tok8-40 sends a token every 40 ms.
MODELS = {"fast": "tok8-0", "slow": "tok8-40", "other": "tok8-0"}
PRICES = {"fast": (1000.0, 2000.0), "slow": (1000.0, 2000.0), "other": (0.0, 0.0)}
"""Dollars per million tokens (in, out): a thousandth of a dollar per input token keeps sums readable."""


def config_text(
    engine: Engine, auth: str, redis: str | None = None, admin: str = "", slots: int = 1024, rules: str = ""
) -> str:
    """``slots``: each backend's ``max_concurrency`` (small: saturated by a few requests); ``rules``:
    the YAML flow list of ``routing.rules``."""
    lines = [
        "limits: {health_interval_s: 0.5}",
        f"auth: {{{auth}}}",
        *([f"redis: {{{redis}}}"] if redis else []),
        *([f"admin: {{{admin}}}"] if admin else []),
        *([f"routing: {{rules: {rules}}}"] if rules else []),
        "models:",
        *(
            f"  - {{name: {name}, params_b: 1, context: 4096, price_per_mtok_in: {PRICES[name][0]},"
            f" price_per_mtok_out: {PRICES[name][1]}}}"
            for name in MODELS
        ),
        "backends:",
        *(
            f"  - {{name: {name}-engine, engine: vllm, url: '{engine.url}', model: {name}, served_model: {served},"
            f" gpu: H100, max_concurrency: {slots}}}"
            for name, served in MODELS.items()
        ),
        "",
    ]
    return "\n".join(lines)


def keys_cli(config: Path, *args: str) -> Any:
    """``enginegate keys ...`` against the config's database; its JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "--config", str(config), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"keys {' '.join(args)} failed: {done.stderr}")
    return orjson.loads(done.stdout)

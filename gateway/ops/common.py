"""What every command shares: loading a config file and printing its problems."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.config import ConfigError, LoadedConfig, load_config


def load_or_report(path: Path) -> LoadedConfig | None:
    """The config, or None after printing every problem with its file and line."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return None

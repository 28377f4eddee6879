"""What every command shares: loading a config file and printing its problems, reading number lists."""

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


def positive_numbers(text: str, flag: str) -> list[float]:
    """``1,2.5,4`` as numbers, for an option such as ``--rate``; a ValueError naming ``flag`` otherwise."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"{flag} {text!r}: expected positive numbers")
    return values

"""A serving process's collector: its startup objects set apart, young objects collected less often
(``gateway.http.limits.tune_gc``), so that a request's objects are freed before a collection walks them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.http.limits import GC_YOUNG_THRESHOLD

ROOT = Path(__file__).resolve().parents[2]


def test_a_serving_process_sets_its_startup_objects_apart_and_collects_young_objects_less_often() -> None:
    # In a process of its own: the collector's settings are process-wide, and this one runs other tests.
    script = (
        "import gc; from gateway.http.limits import tune_gc; default = gc.get_threshold(); tune_gc(); "
        "print(gc.get_threshold()[0], gc.get_threshold()[1:] == default[1:], gc.get_freeze_count() > 1000)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60, env=env
    )
    assert out.stdout.split() == [str(GC_YOUNG_THRESHOLD), "True", "True"]


def test_both_ways_of_serving_tune_the_collector_once_the_app_is_built() -> None:
    # One worker builds the app in the CLI; several build theirs in worker_app: each tunes after building.
    for path, built in (("gateway/cli.py", "app = create_app(loaded)"), ("gateway/app.py", "app = from_environment()")):
        source = (ROOT / path).read_text()
        assert source.index(built) < source.index("tune_gc()"), path

"""Chaos: every engine kind's fake behind a real gateway, random faults, kills, reloads, impatient clients.

One seeded run (``ENGINEGATE_CHAOS_SEED``, default 11) of about a minute. It prints its figures as a
table and fails listing every check missed, with the request ids and the gateway's log lines for each.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.chaos.fleet import BACKENDS
from tests.chaos.run import Chaos
from tests.chaos.schedule import plan
from tests.chaos.tally import analyse

SEED = int(os.environ.get("ENGINEGATE_CHAOS_SEED", "11"))


@pytest.mark.chaos
def test_gateway_under_random_engine_faults_kills_and_reloads(tmp_path: Path, cache_dir: Path) -> None:
    chaos = Chaos(plan(SEED, list(BACKENDS)), tmp_path, cache_dir)
    try:
        chaos.start()
        outcome = asyncio.run(chaos.run())
        alive = chaos.gateway is not None and chaos.gateway.alive()
    finally:
        chaos.stop()
    fig = analyse(
        outcome.results, outcome.upstream, outcome.log, outcome.recoveries, outcome.open_at_end, outcome.reloads,
        alive,
    )  # fmt: skip
    report = "\n".join(
        [f"chaos seed={SEED}: {outcome.elapsed_s:.1f}s, gateway log {outcome.log}", fig.table(), *fig.info]
    )
    print("\n" + report)
    print("fleet transitions (healthy, breaker):\n  " + "\n  ".join(outcome.transitions))
    assert not fig.misses, report + "\n\nMISSED:\n" + "\n\n".join(fig.misses)

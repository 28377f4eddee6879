"""Held metric changes (gateway/telemetry/pending.py): a flush leaves each histogram as ``observe`` of
every held value would have, bucket for bucket (the bounds themselves, NaN, infinities, negatives),
and gives a histogram without the members it writes through each value through ``observe``."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gateway.telemetry.pending import Pending

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0, 10.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def _amounts(seed: int) -> list[float]:
    rng = random.Random(seed)
    edges = [*BUCKETS, 0.0, -1.0, math.inf, math.nan, 1e9]
    return [rng.choice(edges) if rng.random() < 0.3 else rng.uniform(-0.01, 20) for _ in range(500)]


@pytest.mark.parametrize("seed", range(5))
def test_a_flush_counts_as_observe_does(seed: int) -> None:
    amounts = _amounts(seed)
    by_observe, held = CollectorRegistry(), CollectorRegistry()
    one = Histogram("t_seconds", "t", ["route"], buckets=BUCKETS, registry=by_observe).labels("chat")
    other = Histogram("t_seconds", "t", ["route"], buckets=BUCKETS, registry=held).labels("chat")
    pending = Pending()

    async def held_then_flushed() -> None:  # in an event loop: held until the flush
        for n, amount in enumerate(amounts):
            one.observe(amount)
            pending.observe(other, amount)
            if n == 250:
                assert _samples(held)[("t_seconds_count", "")] == 0, "held"
                pending.flush()
        pending.flush()

    asyncio.run(held_then_flushed())
    want, got = _samples(by_observe), _samples(held)
    assert want.keys() == got.keys()
    for key, value in want.items():
        if key[0].endswith("_sum"):  # added in another order: the same up to rounding
            assert (math.isnan(value) and math.isnan(got[key])) or got[key] == pytest.approx(value), key
        else:
            assert got[key] == value, key
    assert got[("t_seconds_count", "")] == sum(1 for a in amounts if a == a)


def test_a_histogram_without_the_members_gets_each_value_through_observe() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    plain, pending = Plain(), Pending()
    for amount in (0.5, 2.0, 0.5):
        pending.observe(plain, amount)
    assert plain.seen == [0.5, 2.0, 0.5], "written at once without an event loop"

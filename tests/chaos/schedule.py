"""The chaos run's plan, a pure function of its seed: what every client sends when, and the fault timeline.

Per-request faults are drawn inside each fake (``recorder.Recorder``, seeded per fake and incarnation);
this module plans the rest: process kills, unhealthy and slow windows, and config reloads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORKERS = 8
REQUESTS_PER_WORKER = 26
PACE_S = 1.3
"""A worker's n-th request starts no earlier than n x PACE_S (plus jitter) after the run's start."""


@dataclass(frozen=True)
class Spec:
    rid: str
    at: float
    """Seconds after the run's start."""
    chat: bool
    stream: bool
    sdk: bool
    """Sent with the official openai client (else raw httpx, which checks every byte of the stream)."""
    max_tokens: int
    leave_after: float | None
    """The client leaves early: a stream after this many events, a whole answer after this many seconds."""
    probe: str | None = None
    """A recovery probe for this backend: fault-free, identical prompt, prefers the backend."""


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    """kill (seconds: down before the restart), unhealthy, slow (value: token_delay_s), queue (value: delay_s),
    burst (every request fails with a 500 while the health route stays fine, until ``seconds`` or enough
    failures to open a breaker), reload."""
    backend: str | None = None
    """The fake it hits; for a reload, the backend rebuilt (None: an unchanged config re-read)."""
    seconds: float = 0.0
    value: float = 0.0
    via: str = ""
    """reload: "sighup" or "admin"."""


@dataclass(frozen=True)
class Plan:
    seed: int
    workers: list[list[Spec]]
    events: list[Event]

    @property
    def duration_s(self) -> float:
        return REQUESTS_PER_WORKER * PACE_S


def plan(seed: int, backends: list[str]) -> Plan:
    rng = random.Random(seed)
    workers: list[list[Spec]] = []
    for w in range(WORKERS):
        specs = []
        for i in range(REQUESTS_PER_WORKER):
            stream = rng.random() < 0.6
            leave = rng.random() < 0.15
            leave_after = (rng.randint(1, 3) if stream else round(rng.uniform(0.05, 0.6), 3)) if leave else None
            specs.append(
                Spec(
                    rid=f"chaos-{seed}-{w * REQUESTS_PER_WORKER + i}",
                    at=round(i * PACE_S + rng.uniform(0, PACE_S / 2), 3),
                    chat=rng.random() < 0.7,
                    stream=stream,
                    sdk=rng.random() < 0.25,
                    max_tokens=rng.randint(8, 24),
                    leave_after=leave_after,
                )
            )
        workers.append(specs)
    span = REQUESTS_PER_WORKER * PACE_S
    targets = rng.sample(backends, len(backends))  # one timeline fault per backend, in a random order
    events = []
    kinds = ["kill", "kill", "kill", "unhealthy", "slow", "queue"]
    for k, (kind, backend) in enumerate(zip(kinds, targets, strict=False)):
        at = round(span * (0.1 + 0.55 * k / len(kinds)) + rng.uniform(0, 2), 3)
        if kind == "kill":
            events.append(Event(at, kind, backend, seconds=round(rng.uniform(0.2, 3.0), 3)))
        elif kind == "unhealthy":
            events.append(Event(at, kind, backend, seconds=round(rng.uniform(2, 5), 3)))
        elif kind == "slow":
            events.append(Event(at, kind, backend, seconds=round(rng.uniform(3, 6), 3), value=0.15))
        else:
            events.append(Event(at, kind, backend, seconds=round(rng.uniform(2, 4), 3), value=1.0))
    # A blip: the backend fails requests while its health route says fine, long enough to open its breaker;
    # on the backend whose own window ended first, well after that window.
    events.append(Event(round(span * 0.7, 3), "burst", targets[3], seconds=4.0))
    at = 3.0
    for r in range(8):
        at = round(at + rng.uniform(3, 5), 3)
        rebuilt = rng.choice(backends) if rng.random() < 0.8 else None
        events.append(Event(at, "reload", rebuilt, via="sighup" if r % 2 == 0 else "admin"))
    return Plan(seed, workers, sorted(events, key=lambda e: e.at))

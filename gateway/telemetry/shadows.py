"""Shadow traffic's bookkeeping: the mirrored requests in flight (bounded per rule, cancelled on
shutdown), their counters, and the comparisons of request pairs (an in-memory ring for
``GET /admin/shadow``, JSON lines appended to ``shadow.log_path`` for ``enginegate shadow report``).

The pipeline (``gateway.pipeline.shadow``) decides and sends; this only keeps count and keeps records,
so the app's state can own it below the pipeline. Nothing here runs on a request's critical path but
``plan``, ``take`` and ``spawn`` (a dict lookup, a counter, a task).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from gateway.config import RoutingConfig, RuleConfig

log = logging.getLogger("enginegate.shadow")

DEFAULT_RING = 10_000


class Shadows:
    def __init__(self, registry: CollectorRegistry, ring: int = DEFAULT_RING) -> None:
        self.ring: deque[dict[str, Any]] = deque(maxlen=ring)
        """The latest comparisons, oldest first."""
        self.tasks: set[asyncio.Task[None]] = set()
        """Mirrored requests in flight (and those waiting for their primary to end)."""
        self._running: dict[str, int] = {}
        self._routing: RoutingConfig | None = None
        self._plans: dict[str, RuleConfig] = {}
        self._pending: list[tuple[Path, bytes]] = []
        self._writer: asyncio.Task[None] | None = None
        self._sent = Counter(
            "enginegate_shadow_requests",
            "Requests mirrored to a rule's shadow candidate (shadow traffic), by rule and candidate (its shadow.to).",
            ["rule", "candidate"], registry=registry,
        )  # fmt: skip
        self._dropped = Counter(
            "enginegate_shadow_dropped",
            "Requests drawn for shadow traffic that were not mirrored or not compared, by reason: full (the rule's "
            "max_concurrency), no_backend (no candidate backend could take it), draining, cancelled (shutdown).",
            ["rule", "candidate", "reason"], registry=registry,
        )  # fmt: skip
        self._failed = Counter(
            "enginegate_shadow_failures",
            "Mirrored requests the candidate failed, by error kind (the client's answer is the primary's either way).",
            ["rule", "candidate", "kind"], registry=registry,
        )  # fmt: skip

    def plan(self, routing: RoutingConfig, rule: str) -> RuleConfig | None:
        """The rule named ``rule`` when it mirrors requests (a dict lookup, rebuilt when the config changes)."""
        if routing is not self._routing:
            self._plans = {r.name: r for r in routing.rules if r.shadow is not None}
            self._routing = routing
        return self._plans.get(rule) if self._plans else None

    def take(self, rule: str, limit: int) -> bool:
        """A slot for one more mirrored request of ``rule``; False when ``limit`` are in flight."""
        running = self._running.get(rule, 0)
        if running >= limit:
            return False
        self._running[rule] = running + 1
        return True

    def release(self, rule: str) -> None:
        self._running[rule] = max(0, self._running.get(rule, 0) - 1)

    def in_flight(self, rule: str) -> int:
        return self._running.get(rule, 0)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a mirrored request as its own task: the primary never awaits it."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug: said, never the primary's problem
            log.error("shadow request failed in the gateway", exc_info=task.exception())

    def sent(self, rule: str, candidate: str) -> None:
        self._sent.labels(rule, candidate).inc()

    def dropped(self, rule: str, candidate: str, reason: str) -> None:
        self._dropped.labels(rule, candidate, reason).inc()

    def failed(self, rule: str, candidate: str, kind: str) -> None:
        self._failed.labels(rule, candidate, kind).inc()

    def record(self, doc: dict[str, Any], path: Path | None) -> None:
        """Keep one pair's comparison: in the ring, and appended to ``path`` when given (in a thread)."""
        self.ring.append(doc)
        if path is None:
            return
        self._pending.append((path, orjson.dumps(doc) + b"\n"))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(_append, batch)
            except OSError as exc:
                log.error("could not write shadow comparisons: %s", exc)

    def cancel(self) -> int:
        """Stop every mirrored request now (shutdown): their engines see the connection close."""
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)

    async def aclose(self) -> None:
        """Cancel what is in flight, then finish writing what was recorded."""
        self.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._writer is not None:
            await self._writer


def _append(batch: list[tuple[Path, bytes]]) -> None:
    """Blocking: one open and one write per file of the batch, so lines never interleave."""
    by_path: dict[Path, list[bytes]] = {}
    for path, line in batch:
        by_path.setdefault(path, []).append(line)
    for path, lines in by_path.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(b"".join(lines))

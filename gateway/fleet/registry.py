"""The running fleet: one entry per backend with what the gateway knows about it now.

A poller asks every backend for health and load on an interval (never a billed completion).
Requests report their outcome to ``Fleet.accounts`` (``accounting``): time to first token and per
token feed the estimator, failures the circuit breaker. Routing reads it all as a ``FleetSnapshot``.
Each backend's context is the smaller of the model entry's and the engine's own: the one it publishes
(read with its health), or one a context refusal named (``Accounts.note_context``); the profile carries
it to placement and the answer's default length.
``reconcile`` builds the entries of a new config, keeping backends whose settings did not change
(their connection pools, learned estimates and breakers survive), and hands back the ones to retire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from backends.base import Backend, BackendError, Health, KnowsContext
from backends.capabilities import capabilities_of
from gateway.config import ConfigError, LoadedConfig
from gateway.fleet.accounting import Accounts
from gateway.fleet.breaker import CircuitBreaker
from gateway.fleet.catalog import capabilities, model_specs, profile
from gateway.fleet.engines import BackendFactory
from gateway.fleet.entry import Entry
from routing.estimator import typical_output
from routing.kv_exact import ExactIndex
from routing.load import current as current_load
from routing.types import BackendState, FleetSnapshot, ModelSpec

if TYPE_CHECKING:
    from gateway.fleet.kv_events import KvEventSubscriber

log = logging.getLogger("enginegate.fleet")


def reconcile(
    loaded: LoadedConfig,
    factory: BackendFactory,
    current: dict[str, Entry],
    abandon: Callable[[Entry], None] = lambda entry: None,
) -> tuple[dict[str, Entry], dict[str, ModelSpec], list[Entry]]:
    """(entries of the new config, its model specs, entries to retire); nothing changes on error,
    and backends built before the error are handed to ``abandon``."""
    models = model_specs(loaded, loaded.ggufs)
    entries: dict[str, Entry] = {}
    built: list[Entry] = []
    try:
        for cfg in loaded.config.backends:
            model = loaded.model(cfg.model)
            old = current.get(cfg.name)
            if old is not None and old.config == cfg:
                caps = capabilities(capabilities_of(old.backend), cfg, model)
                # The engine's context it learned is kept: the same engine still runs with it.
                if old.profile == profile(cfg, loaded, old.profile.context, caps) and old.capabilities == caps:
                    entries[cfg.name] = old
                    continue
            b = loaded.config.routing.breaker
            breaker = CircuitBreaker(cfg.name, b.threshold, b.cooldown_s, b.max_cooldown_s)
            backend = factory(cfg, loaded)
            caps = capabilities(capabilities_of(backend), cfg, model)
            entry = Entry(cfg, backend, profile(cfg, loaded, caps=caps), breaker=breaker, capabilities=caps)
            built.append(entry)
            entries[cfg.name] = entry
    except Exception as exc:
        for entry in built:
            abandon(entry)
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError([f"{loaded.path}: cannot start backend: {type(exc).__name__}: {exc}"]) from exc
    retired = [e for name, e in current.items() if entries.get(name) is not e]
    return entries, models, retired


class Fleet:
    def __init__(self, entries: dict[str, Entry], models: dict[str, ModelSpec], interval_s: float, stale_s: float):
        self.entries = entries
        self.models = models
        self._interval = interval_s
        self._stale = stale_s
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self.after_poll: Callable[[], None] = lambda: None
        """Called after every poll (metrics refresh their backend gauges from it)."""
        self.accounts = Accounts(lambda: self.entries, lambda: self.models)
        """What the requests sent to each backend report (in flight, latencies, breaker, prefix blocks)."""

    @property
    def backends(self) -> dict[str, Backend]:
        return {name: e.backend for name, e in self.entries.items()}

    @property
    def event_streams(self) -> dict[str, KvEventSubscriber]:
        return {name: e.events for name, e in self.entries.items() if e.events is not None}

    def replace(self, entries: dict[str, Entry], models: dict[str, ModelSpec], retired: Iterable[Entry]) -> None:
        """Swap in a new set of entries; retired backends close once their requests are done."""
        self.entries, self.models = entries, models
        if self._task is not None:  # started: the new entries' event streams too
            for entry in entries.values():
                self._listen(entry)
        for entry in retired:
            task = asyncio.create_task(self._retire(entry))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, entry: Entry, patience_s: float = 600.0) -> None:
        """Close a replaced backend (its connection pool) once its last request has ended."""
        await self._unlisten(entry)
        if entry.in_flight > 0:
            entry.drained = asyncio.Event()
            try:
                async with asyncio.timeout(patience_s):
                    await entry.drained.wait()
            except TimeoutError:
                log.warning("closing retired backend %s with %d requests in flight", entry.name, entry.in_flight)
        await entry.backend.aclose()

    def _load_now(self, e: Entry, now: float) -> tuple[int, int, int, bool]:
        """(running, waiting, the engine's slots, whether its gauges are fresh) as routing sees them."""
        fresh = e.load is not None and now - e.load_at <= self._stale
        polled = e.load if fresh else None
        cap, slots = e.profile.max_concurrency, e.engine_slots
        if slots is not None and slots < cap:
            cap = slots
        running, waiting = current_load(
            polled.running if polled else None, polled.waiting if polled else None,
            e.in_flight_at_poll, e.in_flight, cap,
        )  # fmt: skip
        return running, waiting, cap, fresh

    def queue_wait_s(self, entry: Entry) -> float | None:
        """How long a request joining ``entry``'s queue now would wait, when the engine is queueing
        (None when it is not): the requests waiting, over its slots, at its observed service time
        (one second a request before any was observed)."""
        _, waiting, cap, _ = self._load_now(entry, time.monotonic())
        if waiting <= 0:
            return None
        seen = entry.observed
        service_s = seen.tpot_ms * typical_output(seen) / 1000 if seen.tpot_ms is not None else 1.0
        return waiting * service_s / max(1, cap)

    def snapshot(self) -> FleetSnapshot:
        now = time.monotonic()
        states = []
        for e in self.entries.values():
            running, waiting, _, fresh = self._load_now(e, now)
            breaker, share = e.breaker.current()
            load, exact = e.load, e.exact
            # Positional, in BackendState's order (profile, healthy, running, waiting, load_fresh,
            # kv_cache_usage, prefill_backlog_tokens, breaker, recovery, observed, engine_slots, prefix,
            # exact): built for every backend on every request, where keywords cost a microsecond each.
            states.append(
                BackendState(
                    e.profile, e.health.ok, running, waiting, fresh,
                    load.kv_cache_usage if fresh and load else None, e.prefill_backlog, breaker, share,
                    e.observed, e.engine_slots, e.prefix, exact if exact is not None and exact.synced else None,
                )
            )  # fmt: skip
        return FleetSnapshot(tuple(states), self.models)

    @property
    def ready(self) -> bool:
        return any(e.health.ok for e in self.entries.values())

    def targets(self, names: Iterable[str]) -> list[Entry]:
        """The current entries of these backend names, in order (names a reload removed are skipped)."""
        entries = self.entries
        return [e for n in names if (e := entries.get(n)) is not None]

    async def poll_entry(self, entry: Entry) -> None:
        """Read one backend's health and load now (and its context, where the engine publishes it)."""
        was = entry.health.ok
        try:
            entry.health = await asyncio.wait_for(entry.backend.health(), self._interval)
            if entry.health.ok and isinstance(entry.backend, KnowsContext):
                self.accounts.note_context(entry, entry.backend.context_length)
            load = await asyncio.wait_for(entry.backend.load(), self._interval)
        except (BackendError, OSError, TimeoutError, ValueError) as exc:  # down, slow or unreadable: unhealthy
            entry.health = Health(ok=False, detail=f"{type(exc).__name__}: {exc}")
            load = None
        except Exception as exc:  # a bug in a probe: unhealthy too, but with the traceback to fix it
            log.exception("probing backend %s failed unexpectedly", entry.name, extra={"backend": entry.name})
            entry.health = Health(ok=False, detail=f"probe failed: {type(exc).__name__}: {exc}")
            load = None
        first, entry.probed = not entry.probed, True
        if first or entry.health.ok != was:
            # The first probe is logged either way: a backend down from the start says why once.
            log.log(
                logging.INFO if entry.health.ok else logging.WARNING,
                "backend %s is %s%s", entry.name, "healthy" if entry.health.ok else "unhealthy",
                " (first probe)" if first else "",
                extra={"backend": entry.name, "healthy": entry.health.ok, "detail": entry.health.detail[:200],
                       "first_probe": first},
            )  # fmt: skip
        if load is not None:
            entry.load, entry.load_at, entry.in_flight_at_poll = load, time.monotonic(), entry.in_flight
            if (load.waiting > 0 and load.running > 0) or (
                entry.engine_slots is not None and load.running > entry.engine_slots
            ):
                entry.engine_slots = load.running

    async def poll_once(self) -> None:
        await asyncio.gather(*(self.poll_entry(e) for e in list(self.entries.values())))
        self.after_poll()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.poll_once()

    def _listen(self, entry: Entry) -> None:
        """Subscribe to the engine's KV-cache events, once per entry (``backends[].kv_events``)."""
        events = getattr(entry.config, "kv_events", None)
        if events is None or entry.events_task is not None:
            return
        from gateway.fleet.kv_events import KvEventSubscriber  # pyzmq and msgspec: checked with the config

        entry.exact = ExactIndex()
        entry.events = KvEventSubscriber(
            events.endpoint, entry.exact, topic=events.topic, replay_endpoint=events.replay_endpoint
        )
        entry.events_task = asyncio.create_task(entry.events.run(), name=f"kv-events-{entry.name}")

    async def _unlisten(self, entry: Entry) -> None:
        if entry.events_task is not None:
            entry.events_task.cancel()
            await asyncio.gather(entry.events_task, return_exceptions=True)
        if entry.events is not None:
            await entry.events.aclose()
        entry.events_task = entry.events = None

    async def start(self) -> None:
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever(), name="fleet-poller")
        for entry in self.entries.values():
            self._listen(entry)
        if self.accounts.share is not None:
            await self.accounts.share.start()

    async def aclose(self) -> None:
        if self.accounts.share is not None:
            await self.accounts.share.aclose()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await asyncio.gather(*(self._unlisten(e) for e in self.entries.values()), return_exceptions=True)
        await asyncio.gather(*(e.backend.aclose() for e in self.entries.values()), return_exceptions=True)

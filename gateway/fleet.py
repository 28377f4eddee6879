"""The running fleet: one entry per backend with what the gateway knows about it now.

A poller asks every backend for health and load on an interval (never a billed
completion). Requests report their outcome: time to first token and per token
feed the estimator, failures the circuit breaker. Routing reads it all as a
``FleetSnapshot``. Each backend's context is the smaller of the model entry's and
the engine's own: the one it publishes (read with its health), or one a context
refusal named (``note_context``); the profile carries it to placement and the
answer's default length. ``reconcile`` builds the entries of a new config, keeping
backends whose settings did not change (their connection pools, learned
estimates and breakers survive), and hands back the ones to retire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.base import Backend, Health, Load
from backends.capabilities import PLAIN, Capabilities, capabilities_of
from gateway.breaker import CircuitBreaker
from gateway.catalog import capabilities, model_specs, profile, with_context
from gateway.config import BackendConfig, ConfigError, LoadedConfig
from gateway.engines import BackendFactory
from gateway.prefix_share import PrefixShare
from routing.estimator import kv_capacity_tokens, observe, typical_output
from routing.kv_exact import ExactIndex
from routing.load import current as current_load
from routing.prefix import PrefixIndex
from routing.types import BackendProfile, BackendState, FleetSnapshot, ModelSpec, Observed, RequestFeatures

if TYPE_CHECKING:
    from gateway.kv_events import KvEventSubscriber

log = logging.getLogger("enginegate.fleet")


@dataclass
class Entry:
    config: BackendConfig
    backend: Backend
    profile: BackendProfile
    health: Health = field(default_factory=lambda: Health(ok=False, detail="not polled yet"))
    load: Load | None = None
    load_at: float = 0.0
    observed: Observed = field(default_factory=Observed)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    in_flight: int = 0
    """Requests this gateway has sent there and not finished (from the attempt's start)."""
    in_flight_at_poll: int = 0
    prefill_backlog: int = 0
    """Prompt tokens of those requests that have no first token yet."""
    drained: asyncio.Event | None = None
    """Set once this entry, retired by a reload, has no request left (its pool then closes)."""
    engine_slots: int | None = None
    """How many requests the engine runs at once, learned from its gauges: its running count when
    it reported requests waiting (an engine started with a lower cap than the config says)."""
    prefix: PrefixIndex | None = None
    """The prompt blocks the gateway expects the engine to hold (made with the entry's first request)."""
    capabilities: Capabilities = PLAIN
    """What the backend honours (adapter, config and model entry together): routing reads its
    ``features`` from the profile; dispatch reads how to shape the answer (``n``, tools in text)."""
    exact: ExactIndex | None = None
    """What the engine holds, from its KV-cache events (``backends[].kv_events``, vLLM)."""
    events: KvEventSubscriber | None = None
    events_task: asyncio.Task[None] | None = None
    published_context: int | None = None
    """The context the engine last published (``profile.context`` may be lower: learned from a refusal)."""

    def __post_init__(self) -> None:
        self.breaker.name = self.config.name

    @property
    def name(self) -> str:
        return self.config.name

    def context(self, model_context: int) -> int:
        """The most prompt plus answer tokens one request may have here: the model entry's context, or
        the engine's own when it is smaller (``profile.context``)."""
        engine = self.profile.context
        return model_context if engine is None else min(model_context, engine)


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
        self.share: PrefixShare | None = None
        """``routing.prefix.share``: the other replicas hear where this one sent each prompt's blocks."""

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
        cap = e.profile.max_concurrency if e.engine_slots is None else min(e.engine_slots, e.profile.max_concurrency)
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
            states.append(
                BackendState(
                    profile=e.profile,
                    healthy=e.health.ok,
                    running=running,
                    waiting=waiting,
                    load_fresh=fresh,
                    prefill_backlog_tokens=e.prefill_backlog,
                    kv_cache_usage=e.load.kv_cache_usage if fresh and e.load else None,
                    breaker=breaker,
                    recovery=share,
                    observed=e.observed,
                    engine_slots=e.engine_slots,
                    prefix=e.prefix,
                    exact=e.exact if e.exact is not None and e.exact.synced else None,
                )
            )
        return FleetSnapshot(tuple(states), self.models)

    @property
    def ready(self) -> bool:
        return any(e.health.ok for e in self.entries.values())

    # Attempts are counted on the entry they were sent to, not by name: a reload may replace the
    # entry of that name meanwhile, and the retired one must still see its requests end.
    def sending(self, entry: Entry, prompt_tokens: int) -> None:
        """An attempt on ``entry`` starts: it is in flight and its prompt waits to be prefilled."""
        entry.in_flight += 1
        entry.prefill_backlog += prompt_tokens

    def remember(self, entry: Entry, features: RequestFeatures, cached_blocks: int) -> list[float]:
        """The prompt of ``features`` goes to ``entry``: its blocks join what the engine is expected to
        hold. Returns the ages of the ``cached_blocks`` blocks routing expected there (to judge the
        engine's report with)."""
        index = self._index(entry)
        ages = index.ages(features.prefix_blocks, cached_blocks)
        index.add(features.prefix_blocks, features.block_tokens)
        if self.share is not None:
            self.share.sent(entry.name, features.prefix_blocks, features.block_tokens)
        return ages

    def learn(self, backend: str, keys: Sequence[int], block_tokens: float) -> None:
        """Another replica sent a prompt of ``keys`` to ``backend``: the engine holds its blocks now."""
        entry = self.entries.get(backend)
        if entry is not None:
            self._index(entry).add(keys, block_tokens)

    def _index(self, entry: Entry) -> PrefixIndex:
        """The entry's prefix index, made with its first prompt, sized by its model's KV capacity."""
        if entry.prefix is None:
            model = self.models.get(entry.config.model)
            entry.prefix = PrefixIndex(kv_capacity_tokens(model, entry.profile) if model else 0.0)
        return entry.prefix

    def cached(self, entry: Entry, ages: list[float], cached_tokens: int, block_tokens: float) -> None:
        """The engine reported the prompt tokens it reused: the expected cache size follows."""
        if entry.prefix is not None:
            entry.prefix.reported(ages, cached_tokens, block_tokens)

    def first_token(self, entry: Entry, prompt_tokens: int) -> None:
        entry.prefill_backlog = max(0, entry.prefill_backlog - prompt_tokens)

    def end(self, entry: Entry, prompt_tokens: int = 0) -> None:
        """An attempt ended; ``prompt_tokens`` when it ended before its first token."""
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.prefill_backlog = max(0, entry.prefill_backlog - prompt_tokens)
        if entry.in_flight == 0 and entry.drained is not None:
            entry.drained.set()

    def succeeded(
        self, entry: Entry, prior_ttft_ms: float, ttft_ms: float, tpot_ms: float | None, out_tokens: int | None = None
    ) -> None:
        entry.observed = observe(entry.observed, prior_ttft_ms, ttft_ms, tpot_ms, out_tokens)
        entry.breaker.success()

    def failed(self, entry: Entry) -> None:
        entry.breaker.failure()

    def targets(self, names: Iterable[str]) -> list[Entry]:
        """The current entries of these backend names, in order (names a reload removed are skipped)."""
        entries = self.entries
        return [e for n in names if (e := entries.get(n)) is not None]

    def note_context(self, entry: Entry, tokens: int | None, published: bool = True) -> None:
        """The engine's own context: ``published`` by the engine (it replaces what was known), or named
        by one of its context refusals (it only ever lowers what is known). Placement and the answer's
        default length use it from the next request on; a context below the model entry's is logged."""
        if not isinstance(tokens, int) or tokens <= 0:
            return
        known = entry.profile.context
        if published:
            if tokens == entry.published_context:
                return  # read again at every poll: only a change (a relaunched engine) replaces what is known
            entry.published_context = tokens
        elif known is not None:
            tokens = min(tokens, known)
        if tokens == known:
            return
        entry.profile = with_context(entry.profile, tokens)
        model = self.models.get(entry.config.model)
        if model is not None and tokens < model.context:
            log.warning(
                "backend %s serves %s with a context of %d tokens, smaller than the model entry's %d: "
                "answers there are sized to %d tokens with their prompt (%s)",
                entry.name, model.name, tokens, model.context, tokens,
                "the engine says so" if published else "learned from the engine refusing a request",
                extra={"backend": entry.name},
            )  # fmt: skip

    async def poll_entry(self, entry: Entry) -> None:
        """Read one backend's health and load now (and its context, where the engine publishes it)."""
        was = entry.health.ok
        try:
            entry.health = await asyncio.wait_for(entry.backend.health(), self._interval)
            if entry.health.ok:
                self.note_context(entry, getattr(entry.backend, "context_length", None))
            load = await asyncio.wait_for(entry.backend.load(), self._interval)
        except Exception as exc:  # a failed probe is an unhealthy backend, not a crash
            entry.health = Health(ok=False, detail=f"{type(exc).__name__}: {exc}")
            load = None
        if entry.health.ok != was:
            log.log(
                logging.INFO if entry.health.ok else logging.WARNING,
                "backend %s is %s", entry.name, "healthy" if entry.health.ok else "unhealthy",
                extra={"backend": entry.name, "detail": entry.health.detail[:200]},
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
        from gateway.kv_events import KvEventSubscriber  # pyzmq and msgspec: checked with the config

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
        if self.share is not None:
            await self.share.start()

    async def aclose(self) -> None:
        if self.share is not None:
            await self.share.aclose()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await asyncio.gather(*(self._unlisten(e) for e in self.entries.values()), return_exceptions=True)
        await asyncio.gather(*(e.backend.aclose() for e in self.entries.values()), return_exceptions=True)

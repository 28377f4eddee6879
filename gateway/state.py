"""Everything a running gateway holds, and how a new config replaces it without dropping traffic.

``Runtime`` is immutable: a request reads ``state.runtime`` once and keeps that
config to its end. ``reload`` validates the file fully, builds new backends,
swaps runtime and fleet entries in one step (nothing awaits in between) and
keeps the old state on any error; unchanged backends keep their pools and
learned estimates, retired ones close when their requests are done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import GenerationRequest
from backends.gguf_file import GgufError
from gateway.cache import responses as response_cache
from gateway.config import ConfigError, GatewayConfig, LoadedConfig, load_config
from gateway.config.fallbacks import aliases_of, chains_of
from gateway.fleet.catalog import PromptCounter, prompt_counters
from gateway.fleet.catalog import rules as build_rules
from gateway.fleet.engines import BackendFactory
from gateway.fleet.entry import Entry
from gateway.fleet.placement import placement_problems
from gateway.fleet.prefix_share import PrefixShare
from gateway.fleet.registry import Fleet, reconcile
from gateway.telemetry.arms import Splits
from gateway.telemetry.decisions import RecentDecisions
from gateway.telemetry.metrics import MULTIPROCESS_ENV, Metrics
from gateway.telemetry.shadows import Shadows
from gateway.tenancy import gate as tenancy
from gateway.whatif.diff import diff
from gateway.whatif.records import RECENT_REQUESTS, Replayed
from routing.fallback import Step
from routing.prefix import CHARS_PER_TOKEN
from routing.rules import Rules
from routing.types import FleetSnapshot

if TYPE_CHECKING:
    from gateway.telemetry.tracing import Tracing

log = logging.getLogger("enginegate.config")


@dataclass(frozen=True)
class Runtime:
    loaded: LoadedConfig
    rules: Rules
    model_names: frozenset[str]
    counters: dict[str, PromptCounter]
    config: GatewayConfig
    """``loaded.config``, which every request reads: a field (compiled, a native read), not a property."""
    block_bytes: int
    """Bytes of prompt text per prefix block (``routing.prefix.block_tokens``)."""
    # Aliases and fallbacks (docs/traffic.md): empty when the config names none.
    aliases: Mapping[str, str] = field(default_factory=dict)
    """What clients may send in ``model`` besides the models' names: alias -> model."""
    chains: Mapping[str, tuple[Step, ...]] = field(default_factory=dict)
    """Each model's whole fallback chain (``routing.fallback.chains``); absent: it has none."""

    async def measure(self, gen: GenerationRequest, snapshot: FleetSnapshot) -> tuple[int | None, Sequence[int]]:
        """(the prompt's exact token count, None where it is estimated; its token ids when some backend
        tells exactly what it holds, as vLLM's KV-cache events do, else nothing): what routing needs
        of a prompt the model's tokenizer can count."""
        counter = self.counters.get(gen.model)
        ids = await counter.measure_tokens(gen) if counter is not None else None
        if ids is None:
            return None, ()
        return len(ids), ids if any(b.exact is not None for b in snapshot.backends) else ()

    @classmethod
    def of(cls, loaded: LoadedConfig) -> Runtime:
        models = loaded.config.models
        names = frozenset(m.name for m in models)
        counters = prompt_counters(loaded, loaded.ggufs)
        config = loaded.config
        block_bytes = config.routing.prefix.block_tokens * CHARS_PER_TOKEN
        return cls(
            loaded, build_rules(loaded), names, counters, config, block_bytes, aliases_of(models), chains_of(models)
        )


def _tracing(config: GatewayConfig) -> Tracing | None:
    """The app's tracer provider; with tracing off OpenTelemetry is never imported."""
    if config.telemetry.otlp_endpoint is None:
        return None
    from gateway.telemetry.tracing import Tracing

    return Tracing(config.telemetry)


class AppState:
    def __init__(self, loaded: LoadedConfig, factory: BackendFactory) -> None:
        self.factory = factory
        self.runtime = Runtime.of(loaded)
        entries, models, _ = reconcile(loaded, factory, {})
        cfg = loaded.config
        self.fleet = Fleet(entries, models, cfg.limits.health_interval_s, cfg.routing.stale_after_s)
        self.metrics = Metrics(
            lambda: self.fleet.backends,
            lambda: self.fleet.snapshot(),
            self.runtime.model_names,
            multiprocess_dir=os.environ.get(MULTIPROCESS_ENV) or None,
            event_streams=lambda: self.fleet.event_streams,
        )
        self.fleet.after_poll = self.metrics.fleet.refresh
        self.splits = Splits(self.metrics.registry)
        """Weighted splits: per-arm metrics and the canary guard (counts since the config was loaded)."""
        self.splits.configure(cfg.routing.rules)
        if cfg.routing.prefix.share and cfg.redis.url:  # read at start, as the limits' Redis is
            self.fleet.accounts.share = PrefixShare(
                cfg.redis.url, self.fleet.accounts.learn, timeout_s=cfg.redis.timeout_s, count=self.metrics.prefix_share
            )
        self.tenancy = tenancy.build(loaded, self.metrics.registry)
        self.shadows = Shadows(self.metrics.registry, cfg.shadow.ring)
        """Shadow traffic's requests in flight and its comparisons (gateway/pipeline/shadow.py)."""
        """API keys, limits and usage (gateway/tenancy); None without ``auth:`` keys."""
        self.cache = response_cache.build(cfg, self.metrics.registry)
        """The response cache (gateway/cache); None unless ``cache.enabled``."""
        self.tracing = _tracing(cfg)
        """OpenTelemetry traces (``telemetry.otlp_endpoint``); None without an endpoint."""
        self.decisions = recent_decisions(cfg, None)
        """The last routing decisions (``GET /admin/decisions``, the console); None while the admin API is off."""
        self.started = int(time.time())
        self.draining = False
        """Shutting down (SIGTERM): /readyz answers 503, connections are not kept alive."""
        self._reloading = asyncio.Lock()
        self.recent: deque[Replayed] | None = deque(maxlen=RECENT_REQUESTS) if cfg.admin.api_key_env else None
        """The newest routed requests, for ``POST /admin/config/diff`` to replay (kept only with an admin API)."""

    @property
    def config(self) -> GatewayConfig:
        return self.runtime.config

    async def reload(self, path: Path | None = None) -> list[str]:
        """Apply the config file again (or ``path``); returns the problems, empty when applied."""
        problems, _ = await self.reload_applied(path)
        return problems

    async def reload_applied(self, path: Path | None = None) -> tuple[list[str], dict[str, Any]]:
        """``reload``, and what it applied: ``{"backends": {"kept", "started", "retired": [names]},
        "diff": [every setting changed, by name], "placement_errors": [backends that can never serve their
        model]}`` (empty when rejected)."""
        async with self._reloading:
            before = self.runtime.loaded
            source = path or self.runtime.loaded.path
            abandoned: list[Entry] = []
            try:
                # Reading YAML and GGUF files, building backends (in-process engines load their models)
                # and the prompt counters' tokenizers are slow: off the event loop, which keeps serving.
                loaded = await asyncio.to_thread(load_config, source, self.runtime.loaded.ggufs)
                runtime = await asyncio.to_thread(Runtime.of, loaded)
                current = dict(self.fleet.entries)
                entries, models, retired = await asyncio.to_thread(
                    reconcile, loaded, self.factory, current, abandoned.append
                )
            except (ConfigError, GgufError) as exc:
                for entry in abandoned:
                    await entry.backend.aclose()
                problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
                self.metrics.reload("error")
                log.error("config reload rejected, keeping the running config: %s", "; ".join(problems))
                return problems, {}
            kept = [name for name, e in entries.items() if current.get(name) is e]
            started = [e for name, e in entries.items() if current.get(name) is not e]
            # New backends get their first health reading before they take traffic: swapped in
            # unpolled, they would count as unhealthy and a lone backend's requests would get 503s.
            await asyncio.gather(*(self.fleet.poll_entry(e) for e in started))
            self.runtime = runtime
            self.fleet.replace(entries, models, retired)
            self.metrics.set_models(self.runtime.model_names)
            self.splits.configure(loaded.config.routing.rules)
            self.decisions = recent_decisions(loaded.config, self.decisions)
            if self.tenancy is not None:
                self.tenancy.reconfigure(loaded.config.auth, tenancy.prices_of(loaded.config))
            self.metrics.reload("ok")
            backends = {"kept": kept, "started": [e.name for e in started], "retired": [e.name for e in retired]}
            changes = [c.to_dict() for c in diff(before.config, loaded.config)]
            # Applied all the same, as at start (the other backends serve); said in the log and the answer.
            impossible = (await asyncio.to_thread(placement_problems, loaded))[0]
            for problem in impossible:
                log.error("%s", problem)
            log.info(
                "config reloaded from %s: backends kept %s, started %s, retired %s; %d settings changed",
                source, kept, backends["started"], backends["retired"], len(changes),
            )  # fmt: skip
            self.fleet.after_poll()
            return [], {"backends": backends, "diff": changes, "placement_errors": impossible}


def recent_decisions(cfg: GatewayConfig, kept: RecentDecisions | None) -> RecentDecisions | None:
    """The ring of recent decisions ``cfg`` asks for (keeping what ``kept`` holds), or None: without an
    admin key nobody can read them, so nothing is kept."""
    size = cfg.admin.recent_decisions if cfg.admin.api_key_env else 0
    if size == 0:
        return None
    if kept is None:
        return RecentDecisions(size)
    return kept if kept.size == size else kept.resized(size)

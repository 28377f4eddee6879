"""The response cache a running gateway holds (``cache.enabled``): lookups and stores, counted.

The pipeline asks ``lookup`` after the request is admitted (rate limits count it) and before routing;
a hit is answered from the stored chunks and never reaches the fleet. A miss stores the answer once
it finished normally (``entries.finished``). A store that fails is counted and the request is served
by the engine as if there were no cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from backends.base import Chunk, GenerationRequest
from gateway.cache import entries
from gateway.cache.stores import MemoryStore, RedisStore, Store, StoreDown
from gateway.config import GatewayConfig

log = logging.getLogger("enginegate.cache")


@dataclass(frozen=True, slots=True)
class Lookup:
    """One request's dealing with the cache: its key (None: bypassed, ``reason`` says why) and the
    answer found (None: a miss)."""

    key: str | None
    reason: str
    hit: list[Chunk] | None = None

    @property
    def header(self) -> str:
        """``x-enginegate-cache``: hit, miss or bypass."""
        return "hit" if self.hit is not None else "bypass" if self.key is None else "miss"


class ResponseCache:
    def __init__(self, store: Store, registry: CollectorRegistry) -> None:
        self.store = store
        self._lookups = Counter(
            "enginegate_cache_lookups",
            "Response cache lookups by result: hit, miss, bypass_sampled, bypass_tools, bypass_model, error"
            " (the store could not be read: the engine answered).",
            ["result"], registry=registry,
        )  # fmt: skip
        self._stores = Counter(
            "enginegate_cache_stores",
            "Answers offered to the response cache by outcome: stored, unfinished (an error, a cut stream or a"
            " content filter: never stored), too_large (over cache.max_entry_bytes), error (the store failed).",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self._versions: tuple[GatewayConfig, dict[str, str]] | None = None

    def _version(self, config: GatewayConfig, model: str) -> str:
        known = self._versions
        if known is None or known[0] is not config:  # once per config: reloads change it
            known = (config, {m.name: entries.model_version(m, config.cache.version) for m in config.models})
            self._versions = known
        return known[1].get(model, "")

    async def lookup(
        self, config: GatewayConfig, gen: GenerationRequest, key_id: str | None, team: str | None
    ) -> Lookup:
        reason = entries.bypass(gen, config.cache)
        if reason is not None:
            self._lookups.labels(f"bypass_{reason}").inc()
            return Lookup(None, reason)
        scope = entries.scope_of(config.cache.scope, key_id, team)
        key = entries.key_of(gen, scope, self._version(config, gen.model))
        try:
            blob = await self.store.get(key)
        except StoreDown as exc:
            self._lookups.labels("error").inc()
            log.warning("response cache unreadable, the engine answers: %s", exc)
            return Lookup(None, "error")
        if blob is None:
            self._lookups.labels("miss").inc()
            return Lookup(key, "miss")
        self._lookups.labels("hit").inc()
        return Lookup(key, "hit", entries.decode(blob))

    async def keep(self, config: GatewayConfig, key: str, chunks: Sequence[Chunk], n: int) -> None:
        """Store a missed request's answer, if it finished normally and fits."""
        if not entries.finished(chunks, n):
            self._stores.labels("unfinished").inc()
            return
        blob = entries.encode(chunks)
        if len(blob) > config.cache.max_entry_bytes:
            self._stores.labels("too_large").inc()
            return
        try:
            await self.store.put(key, blob, config.cache.ttl_s)
        except StoreDown as exc:
            self._stores.labels("error").inc()
            log.warning("response cache unwritable: %s", exc)
            return
        self._stores.labels("stored").inc()


def build(config: GatewayConfig, registry: CollectorRegistry) -> ResponseCache | None:
    """The cache ``cache:`` asks for, or None (off: nothing on the request path)."""
    cache, redis = config.cache, config.redis
    if not cache.enabled:
        return None
    store: Store
    if cache.store == "redis" or (cache.store == "auto" and redis.url):
        assert redis.url is not None  # the schema refuses store: redis without redis.url
        store = RedisStore(redis.url, cache.max_bytes, redis.timeout_s, redis.retry_s)
    else:
        store = MemoryStore(cache.max_bytes)
    return ResponseCache(store, registry)

"""The ``cache:`` section: the response cache of deterministic answers (``gateway/cache``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.strict import Frozen


class CacheConfig(Frozen):
    enabled: bool = False
    """Serve repeated deterministic requests (``temperature`` 0, or a fixed ``seed``) from a cache of
    whole answers instead of an engine. Read at start (a reload that turns it on or off waits for a restart)."""
    store: Literal["auto", "memory", "redis"] = "auto"
    """Where answers are kept: ``redis`` (``redis.url``, shared by replicas), ``memory`` (this process, LRU)
    or ``auto`` (Redis when ``redis.url`` is set). Read at start."""
    ttl_s: float = Field(default=300.0, gt=0, le=30 * 86400)
    """An answer is served from the cache this long after it was stored."""
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """The most the cache holds, in bytes of stored answers: beyond it the least recently used (in
    memory) or the soonest to expire (Redis) go first. Read at start."""
    max_entry_bytes: int = Field(default=1024 * 1024, ge=256)
    """An answer larger than this (stored) is not cached."""
    scope: Literal["key", "team", "global"] = "key"
    """Who shares answers: each API key its own (``key``), the keys of one team (``team``; a key without a
    team keeps its own), or every key (``global``). Requests without a key share one scope of their own."""
    models: list[str] = []
    """Glob patterns of the models whose answers are cached; empty: every model."""
    cache_tools: bool = False
    """Also cache requests that offer ``tools``: the model's tool calls are then replayed without the
    client's tools having run again. Off, since a tool call may have side effects the client expects
    to repeat."""
    version: str = ""
    """Part of every key: change it when a model's weights change under the same name and files
    (answers stored before are never served again). A change to a model's entry in ``models:`` does
    that by itself."""

    @model_validator(mode="after")
    def _sizes(self) -> CacheConfig:
        if self.max_entry_bytes > self.max_bytes:
            raise ValueError(f"max_entry_bytes ({self.max_entry_bytes}) must not exceed max_bytes ({self.max_bytes})")
        return self

"""The response cache in the pipeline (``gateway/cache``): a hit answered without an engine, a miss's
answer kept once it finished normally.

A hit is rendered by the request's own front door from the stored chunks, whole or as a stream (all
its events in one write), and never enters the fleet: no backend's in-flight count, estimate or
breaker sees it. Its usage is the stored answer's; tenancy counts the request against the key's
rate limits but charges no tokens or dollars (``RequestLife.from_cache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from backends.base import Chunk, GenerationRequest
from gateway.cache.responses import ResponseCache
from gateway.config import GatewayConfig
from gateway.pipeline.events import Events
from gateway.pipeline.lifecycle import RequestLife
from gateway.pipeline.surfaces import Work

if TYPE_CHECKING:
    from gateway.http.exchange import Exchange
    from routing.types import RequestFeatures


@dataclass(frozen=True, slots=True)
class Missed:
    """A cacheable request the cache did not have: where its answer goes once it finished."""

    cache: ResponseCache
    config: GatewayConfig
    key: str
    n: int

    async def keep(self, chunks: Sequence[Chunk]) -> None:
        await self.cache.keep(self.config, self.key, chunks, self.n)


async def look(
    cache: ResponseCache,
    config: GatewayConfig,
    gen: GenerationRequest,
    feats: RequestFeatures,
    ex: Exchange,
    work: Work,
    life: RequestLife,
) -> tuple[bool, Missed | None]:
    """(whether the request was answered from the cache; where to keep the engine's answer else, None
    when it is not cacheable or the store is down)."""
    lookup = await cache.lookup(config, gen, feats.key, feats.team)
    ex.header("x-enginegate-cache", lookup.header)
    if lookup.hit is not None:
        await _replay(ex, work, lookup.hit, life)
        return True, None
    return False, Missed(cache, config, lookup.key, gen.n) if lookup.key is not None else None


async def _replay(ex: Exchange, work: Work, chunks: list[Chunk], life: RequestLife) -> None:
    answer = work.events
    if answer is None:
        doc, usage = work.whole(chunks)
        life.overhead_header(0.0)  # no engine: all of its time was the gateway's
        await ex.respond(200, orjson.dumps(doc))
        life.from_cache(usage)
        return
    events = Events(answer)
    data = [out for out in map(events.add, chunks) if out is not None]
    life.overhead_header(0.0)
    ex.failure = answer.failure
    await ex.start_stream()
    await ex.end_stream(b"".join(data) + events.closing())
    life.from_cache(events.usage)

"""Where the response cache keeps answers: this process's memory, or a Redis shared by replicas.

Both hold encoded answers by key for ``ttl_s`` within ``max_bytes``. In memory the least recently
used go first. In Redis one script stores an answer and keeps the sum of what is stored under the
cap, dropping the entries that expire soonest (with one TTL: the oldest); every key shares one hash
tag so the script's keys live on one cluster slot. A Redis that cannot be reached raises
``StoreDown``: the cache is skipped for the request (the engine answers), never an error for the client.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Protocol

PREFIX = "egc:{c}:"
"""Every key of the cache in Redis (one hash tag: one cluster slot)."""

_STORE = """
local now, ttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, blob, prefix = ARGV[4], ARGV[5], ARGV[6]
local function forget(m)
  local size = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  return redis.call('DECRBY', KEYS[3], size)
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 64)) do forget(m) end
if redis.call('HEXISTS', KEYS[2], member) == 1 then forget(member) end
redis.call('SET', prefix .. member, blob, 'PX', ttl)
redis.call('ZADD', KEYS[1], now + ttl, member)
redis.call('HSET', KEYS[2], member, string.len(blob))
local total = redis.call('INCRBY', KEYS[3], string.len(blob))
while total > cap do
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #first == 0 then break end
  redis.call('DEL', prefix .. first[1])
  total = forget(first[1])
end
return total
"""


class StoreDown(Exception):
    """The store cannot be reached now."""


class Store(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, blob: bytes, ttl_s: float) -> None: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """An LRU of answers in this process, bounded by their bytes, each kept its ``ttl_s``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def get(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= time.monotonic():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return found[1]

    async def put(self, key: str, blob: bytes, ttl_s: float) -> None:
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (time.monotonic() + ttl_s, blob)
        self.bytes += len(blob)
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        self.bytes -= len(self._entries.pop(key)[1])

    async def aclose(self) -> None:
        self._entries.clear()
        self.bytes = 0


class RedisStore:
    """Answers in Redis with their TTL, the sum of their sizes under ``max_bytes``. After a failure
    Redis is left alone for ``retry_s`` (requests meanwhile skip the cache at once instead of
    waiting ``timeout_s`` each)."""

    def __init__(self, url: str, max_bytes: int, timeout_s: float, retry_s: float) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        once = Retry(NoBackoff(), 0)  # no retries: a failed call skips the cache at once
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=16, timeout=timeout_s, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=once, protocol=2,
        )  # fmt: skip
        self._redis: Any = aioredis.Redis(connection_pool=pool, retry=once)
        self._store = self._redis.register_script(_STORE)
        self.max_bytes, self.retry_s = max_bytes, retry_s
        self._down_until = 0.0

    def _check(self) -> None:
        if self._down_until > time.monotonic():
            raise StoreDown("redis was unreachable moments ago")

    def _failed(self, exc: Exception) -> StoreDown:
        self._down_until = time.monotonic() + self.retry_s
        return StoreDown(f"{type(exc).__name__}: {exc}")

    async def get(self, key: str) -> bytes | None:
        from redis.exceptions import RedisError

        self._check()
        try:
            blob: bytes | None = await self._redis.get(PREFIX + key)
        except (RedisError, OSError, TimeoutError) as exc:
            raise self._failed(exc) from exc
        return blob

    async def put(self, key: str, blob: bytes, ttl_s: float) -> None:
        from redis.exceptions import RedisError

        self._check()
        keys = [PREFIX + "expiry", PREFIX + "sizes", PREFIX + "bytes"]
        now_ms, ttl_ms = int(time.time() * 1000), max(1, round(ttl_s * 1000))
        args: list[bytes | str | int] = [now_ms, ttl_ms, self.max_bytes, key, blob, PREFIX]
        try:
            await self._store(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise self._failed(exc) from exc

    async def aclose(self) -> None:
        await self._redis.aclose()

"""The limiter's counters in Redis, shared by every replica: one script call admits or refuses a request
(one round trip, atomic on the server), another settles it.

Per key ``K`` (hash-tagged, so a Redis Cluster keeps them on one node): ``eg:{K}:req`` (a sorted set of
admitted requests by time), ``eg:{K}:tok`` with ``eg:{K}:tokn`` and ``eg:{K}:tsum`` (each request's
tokens by time, and their sum), ``eg:{K}:conc`` (concurrency leases by their end) and
``eg:{K}:spend:<period>`` (nano-dollars). Timestamps are the replicas' clocks in milliseconds: keep
them in sync (NTP); a skew of a few milliseconds only shifts the window's edge.

When Redis cannot be reached the fail mode decides: ``open`` admits with this process's own
counters (``LocalLimiter``, limits per replica) and tries Redis again after ``retry_s``;
``closed`` raises ``LimiterDown`` (the gateway answers 503).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.tenancy.limiter import Ask, LocalLimiter, Verdict

log = logging.getLogger("enginegate.tenancy")

_ADMIT = """
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm, climit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local member, tokens, lease = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local budget, cost, ttl, seed = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12]
local edge = now - window
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', edge)
while true do
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', edge, 'LIMIT', 0, 500)
  if #old == 0 then break end
  local amounts = redis.call('HMGET', KEYS[3], unpack(old))
  local freed = 0
  for i = 1, #amounts do freed = freed + (tonumber(amounts[i]) or 0) end
  redis.call('HDEL', KEYS[3], unpack(old))
  redis.call('ZREM', KEYS[2], unpack(old))
  redis.call('DECRBY', KEYS[4], freed)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[4]) or '0')
local spent = redis.call('GET', KEYS[6])
if not spent then
  redis.call('SET', KEYS[6], seed, 'EX', ttl)
  spent = tonumber(seed)
else
  spent = tonumber(spent)
end
local function newest(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return math.max(0, tonumber(last[2]) + window - now)
end
local function refuse(why, retry)
  local rr = 0
  if rpm > 0 then rr = math.max(0, rpm - count) end
  local rt = 0
  if tpm > 0 then rt = math.max(0, tpm - used) end
  return {0, why, tostring(retry), rr, rt, tostring(newest(KEYS[1])), tostring(newest(KEYS[2]))}
end
if budget > 0 and spent + cost > budget then return refuse('quota', 0) end
if rpm > 0 and count >= rpm then
  local at = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  return refuse('requests', tonumber(at[2]) + window - now)
end
if tpm > 0 and tokens > tpm then return refuse('too_large', window) end
if tpm > 0 and used + tokens > tpm then
  local need = used + tokens - tpm
  local retry = window
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    need = need - (tonumber(redis.call('HGET', KEYS[3], entries[i])) or 0)
    if need <= 0 then retry = tonumber(entries[i + 1]) + window - now break end
  end
  return refuse('tokens', retry)
end
if climit > 0 and redis.call('ZCARD', KEYS[5]) >= climit then return refuse('concurrency', 1000) end
redis.call('ZADD', KEYS[1], now, member)
redis.call('ZADD', KEYS[2], now, member)
redis.call('HSET', KEYS[3], member, tokens)
redis.call('INCRBY', KEYS[4], tokens)
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], math.ceil(window) + 1000) end
if climit > 0 then
  redis.call('ZADD', KEYS[5], now + lease, member)
  redis.call('PEXPIRE', KEYS[5], lease + 1000)
end
if cost > 0 then redis.call('INCRBY', KEYS[6], cost) end
local rr = 0
if rpm > 0 then rr = math.max(0, rpm - count - 1) end
local rt = 0
if tpm > 0 then rt = math.max(0, tpm - used - tokens) end
return {1, '', '0', rr, rt, tostring(window), tostring(window)}
"""

_SETTLE = """
local member, tokens, delta = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREM', KEYS[4], member)
local old = redis.call('HGET', KEYS[2], member)
if old and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[2], member, tokens)
  redis.call('INCRBY', KEYS[3], tokens - tonumber(old))
end
if delta ~= 0 and redis.call('EXISTS', KEYS[5]) == 1 then redis.call('INCRBY', KEYS[5], delta) end
return 1
"""


_CONNECTIONS = 32


class LimiterDown(Exception):
    """Redis cannot be reached and the fail mode is ``closed``."""


def _keys(ask: Ask) -> list[str]:
    base = f"eg:{{{ask.key}}}"
    return [f"{base}:req", f"{base}:tok", f"{base}:tokn", f"{base}:tsum", f"{base}:conc", f"{base}:spend:{ask.period}"]


class RedisLimiter:
    def __init__(
        self,
        url: str,
        fail_open: bool,
        timeout_s: float,
        retry_s: float,
        on_fallback: Callable[[str], None] = lambda _: None,
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # A bounded pool that makes a burst wait its turn for a connection (briefly: that wait counts
        # as Redis being unreachable too) instead of opening one connection per request.
        # No retries: a failed call goes to the fail mode at once instead of adding backoff to the request.
        # RESP2: under RESP3, redis-py 7+ turns on its maintenance notifications and then skips the
        # check that replaces a pooled connection the server closed, so after Redis restarts every
        # connection in the pool would fail its next call (and trip the fail mode once more each).
        once = Retry(NoBackoff(), 0)
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=_CONNECTIONS, timeout=timeout_s * 20, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=once, protocol=2,
        )  # fmt: skip
        self._redis: Any = aioredis.Redis(connection_pool=pool, retry=once)
        self._admit = self._redis.register_script(_ADMIT)
        self._settle = self._redis.register_script(_SETTLE)
        self.fail_open = fail_open
        self.retry_s = retry_s
        self.local = LocalLimiter()
        """The fallback's counters (fail open), and where requests it admitted are settled."""
        self._down_until = 0.0
        self._on_fallback = on_fallback

    def _failed(self, exc: BaseException, what: str) -> None:
        first = self._down_until == 0.0
        self._down_until = time.monotonic() + self.retry_s
        if first:
            log.warning("redis unreachable (%s: %s); %s", what, type(exc).__name__,
                        "using this process's counters" if self.fail_open else "refusing requests")  # fmt: skip
        self._on_fallback(what)

    def _fallback(self, ask: Ask, now: float) -> Verdict:
        if not self.fail_open:
            raise LimiterDown
        return self.local.admit_now(ask, now)

    async def admit(self, ask: Ask, now: float) -> Verdict:
        from redis.exceptions import RedisError

        if self._down_until and time.monotonic() < self._down_until:
            self._on_fallback("admit")
            return self._fallback(ask, now)
        args: list[str | int] = [
            round(now * 1000), round(ask.window_s * 1000), ask.rpm, ask.tpm, ask.concurrency, ask.member, ask.tokens,
            round(ask.lease_s * 1000), ask.budget_nanos, ask.cost_nanos, ask.period_ttl_s, ask.spent_nanos,
        ]  # fmt: skip
        try:
            r = await self._admit(keys=_keys(ask), args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc, "admit")
            return self._fallback(ask, now)
        if self._down_until:
            log.warning("redis reachable again")
            self._down_until = 0.0
        refused = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        return Verdict(
            admitted=int(r[0]) == 1,
            refused=refused or None,
            retry_after_s=float(r[2]) / 1000,
            remaining_requests=int(r[3]),
            remaining_tokens=int(r[4]),
            reset_requests_s=float(r[5]) / 1000,
            reset_tokens_s=float(r[6]) / 1000,
            local=False,
        )

    async def settle(self, ask: Ask, tokens: int, cost_nanos: int, local: bool = False) -> None:
        from redis.exceptions import RedisError

        if local:
            self.local.settle_now(ask, tokens, cost_nanos)
            return
        keys = _keys(ask)
        try:
            await self._settle(keys=[keys[1], keys[2], keys[3], keys[4], keys[5]],
                               args=[ask.member, tokens, cost_nanos - ask.cost_nanos])  # fmt: skip
        except (RedisError, OSError, TimeoutError) as exc:
            # The reservation stays (never less than the real use) and the slot's lease ends it.
            self._failed(exc, "settle")

    async def close(self) -> None:
        await self._redis.aclose()

"""The limiter's server-side scripts (one call each, atomic on the server) over one key's Redis keys:
``KEYS`` = request times, token entries by time, tokens by entry, their sum, concurrency leases, the
period's spend and the period's reservations not settled yet (``redis_limiter._keys``).

``ADMIT`` admits or refuses; ``SETTLE`` replaces a reservation with the real use (once: the
reservation's entry is removed as it is corrected, so a replayed settlement changes nothing);
``PUSH`` writes back one request a replica counted while Redis was away (idempotent the same way:
an entry already there is not counted again, and its spend is charged once).
"""

from __future__ import annotations

ADMIT = """
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
if cost > 0 then
  redis.call('INCRBY', KEYS[6], cost)
  redis.call('HSET', KEYS[7], member, cost)
  redis.call('EXPIRE', KEYS[7], ttl)
end
local rr = 0
if rpm > 0 then rr = math.max(0, rpm - count - 1) end
local rt = 0
if tpm > 0 then rt = math.max(0, tpm - used - tokens) end
return {1, '', '0', rr, rt, tostring(window), tostring(window)}
"""

SETTLE = """
local member, tokens, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREM', KEYS[5], member)
local old = redis.call('HGET', KEYS[3], member)
if old and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HSET', KEYS[3], member, tokens)
  redis.call('INCRBY', KEYS[4], tokens - tonumber(old))
end
local reserved = redis.call('HGET', KEYS[7], member)
if reserved then
  redis.call('HDEL', KEYS[7], member)
  if redis.call('EXISTS', KEYS[6]) == 1 then redis.call('INCRBY', KEYS[6], cost - tonumber(reserved)) end
end
return 1
"""

PUSH = """
local now, window, member, at = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local tokens, lease_end, charge, cost = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1', tonumber(ARGV[8])
local in_flight, seed, ttl = ARGV[9] == '1', ARGV[10], tonumber(ARGV[11])
local unseen = at <= now - window
if not unseen then
  redis.call('ZADD', KEYS[1], 'NX', at, member)
  local old = redis.call('HGET', KEYS[3], member)
  if not old then
    unseen = true
    redis.call('ZADD', KEYS[2], at, member)
    redis.call('HSET', KEYS[3], member, tokens)
    redis.call('INCRBY', KEYS[4], tokens)
  elseif tonumber(old) ~= tokens then
    redis.call('HSET', KEYS[3], member, tokens)
    redis.call('INCRBY', KEYS[4], tokens - tonumber(old))
  end
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], math.ceil(window) + 1000) end
end
if lease_end > now then
  redis.call('ZADD', KEYS[5], lease_end, member)
  local life = lease_end - now + 1000
  if redis.call('PTTL', KEYS[5]) < life then redis.call('PEXPIRE', KEYS[5], life) end
else
  redis.call('ZREM', KEYS[5], member)
end
if charge and cost > 0 then
  if redis.call('EXISTS', KEYS[6]) == 0 then redis.call('SET', KEYS[6], seed, 'EX', ttl) end
  local reserved = redis.call('HGET', KEYS[7], member)
  if reserved then
    if not in_flight then
      redis.call('HDEL', KEYS[7], member)
      redis.call('INCRBY', KEYS[6], cost - tonumber(reserved))
    end
  elseif unseen then
    redis.call('INCRBY', KEYS[6], cost)
    if in_flight then
      redis.call('HSET', KEYS[7], member, cost)
      redis.call('EXPIRE', KEYS[7], ttl)
    end
  end
end
return 1
"""

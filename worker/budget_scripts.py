"""The Redis scripts of tenant budgets (`worker.budgets`): each one atomic, one round trip.

Keys of one tenant: its spend in a period (`chatq:budget:{tenant}:{period}`, a hash of `tokens`,
`micro_usd`, `announced`), its turns admitted and not ended (`chatq:budget:{tenant}:running`, a
sorted set of turn ids scored by when their admission lapses) and the largest price one of its
turns had (`chatq:budget:{tenant}:estimate`, a hash of `tokens` and `micro_usd`).
"""

from __future__ import annotations

__all__ = ["ADD", "ADMIT", "ANNOUNCE", "SEED"]

SEED = """
-- KEYS[1] spend; ARGV: tokens, micro_usd, expiry (Unix time). Written only if no worker did first.
if redis.call('HEXISTS', KEYS[1], 'tokens') == 0 then
  redis.call('HSET', KEYS[1], 'tokens', ARGV[1], 'micro_usd', ARGV[2])
  redis.call('EXPIREAT', KEYS[1], ARGV[3])
end
return redis.call('HMGET', KEYS[1], 'tokens', 'micro_usd')
"""

ADD = """
-- KEYS[1] spend, KEYS[2] estimate; ARGV: tokens, micro_usd, estimate's lifetime (seconds).
-- The turn's price raises the estimate; a missing spend is left for the caller to sum (false).
for i, field in ipairs({'tokens', 'micro_usd'}) do
  local known = redis.call('HGET', KEYS[2], field)
  if not known or tonumber(known) < tonumber(ARGV[i]) then
    redis.call('HSET', KEYS[2], field, ARGV[i])
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[3])
if redis.call('HEXISTS', KEYS[1], 'tokens') == 0 then return false end
return {redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[1]), redis.call('HINCRBY', KEYS[1], 'micro_usd', ARGV[2])}
"""

ADMIT = """
-- KEYS[1] spend, KEYS[2] running, KEYS[3] estimate; ARGV: the budget's field, its limit in that
-- field's unit, now, when this admission lapses (both Unix time), the turn id, the running set's lifetime.
-- {'missing'} when the spend must be summed first; {'refuse', spent}: spent; {'admit', spent};
-- {'wait', spent}: other turns run, and one more could take the spend past the limit.
if redis.call('HEXISTS', KEYS[1], 'tokens') == 0 then return {'missing', 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[5])
local spent = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local limit = tonumber(ARGV[2])
if spent >= limit then return {'refuse', tostring(spent)} end
local running = redis.call('ZCARD', KEYS[2])
local each = redis.call('HGET', KEYS[3], ARGV[1])  -- false while no turn of the tenant ended
if running == 0 or (each and spent + (running + 1) * tonumber(each) <= limit) then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
  return {'admit', tostring(spent)}
end
return {'wait', tostring(spent)}
"""

ANNOUNCE = """
-- KEYS[1] spend, KEYS[2] the announcement channel, KEYS[3] its stream; ARGV[2] the event's JSON.
if redis.call('HSETNX', KEYS[1], 'announced', ARGV[1]) == 0 then return 0 end
redis.call('PUBLISH', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'event', ARGV[2])
return 1
"""

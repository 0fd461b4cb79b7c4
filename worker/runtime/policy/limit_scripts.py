"""The Lua scripts behind `worker.runtime.policy.limits`: each change of a model's shared limits is one of
them, so it is atomic across every worker and host (Redis runs a script alone), on Redis's clock.

The state they keep, per scope (a model at a base URL), is described in `worker.runtime.policy.limits`.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "BACKLOG_GRACE_MS", "GIVE_BACK", "INCREASE_RPM", "QUEUED_GRACE_MS", "RELEASE", "THROTTLED"]

BACKLOG_GRACE_MS = 1000
"""A tenant counts as backlogged until this long after its line's last turn is due to come back."""
QUEUED_GRACE_MS = 250
"""A tenant backlogged only by its turns waiting in the queue stays so this long after an ask last saw
them there: every ask while the threads are the bottleneck sees them again, and once they are all
taken its other tenants stop yielding to it soon (its turns that wait are then in its line)."""

INCREASE_RPM = 0.3
"""Additive increase of the adaptive rate per success (requests per minute): about 5% per 10 s at any rate."""

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function n(v, d) if v then return tonumber(v) end return d end
local function eff(c, a) if c > 0 and a > 0 then return math.min(c, a) end return math.max(c, a) end
"""

# KEYS: hash, slots, interactive waiters, sent log, tenants' shares, backlogged tenants; for a scope
# that counts the tenants whose turns wait in a queue (the workers' threads), that queue's counts
# (`worker.tenant_queue`) and the queue's list.
# ARGV: member, interactive, cfg rpm, cfg tpm, cfg concurrency, token hint, lease ms, burst ms, tenant, weight,
# pool ('1': the concurrency is the workers' own threads, which never lets more run: pace and share,
# never refuse for it), queue slack (takes), the weights (`tenant=w,...,*=w`; '': each as last seen),
# the queue's quiet time (ms).
ACQUIRE = (
    _PRELUDE
    + f"local BACKLOG_GRACE, QUEUED_GRACE = {BACKLOG_GRACE_MS}, {QUEUED_GRACE_MS}\n"
    + """
local H, S, W, R, F, B, Q, L = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local member, interactive, lease = ARGV[1], ARGV[2] == '1', tonumber(ARGV[7])
local tenant, weight, pool, slack = ARGV[9], tonumber(ARGV[10]), ARGV[11] == '1', tonumber(ARGV[12] or '0')
local quiet = tonumber(ARGV[14] or '0')
-- Another tenant's weight: the configured one where the asker knows the table (a tenant whose turns
-- only wait in the queue has never said its own), else the one it last asked with.
local table_w, default_w = {}, nil
for entry in string.gmatch(ARGV[13] or '', '[^,]+') do
  local name, value = string.match(entry, '^(.*)=([^=]*)$')
  if name == '*' then default_w = tonumber(value) elseif name then table_w[name] = tonumber(value) end
end
local function weight_of(other, stored) return table_w[other] or default_w or n(stored, 1) end
local f = redis.call('HMGET', H, 'r_tat', 't_tat', 'b_next', 'a_rpm', 'a_tpm', 'a_conc', 'avg_ms', 'est', 'hold')
local r_tat, t_tat, hold = n(f[1], 0), n(f[2], 0), n(f[9], 0)
local rpm, tpm = eff(tonumber(ARGV[3]), n(f[4], 0)), eff(tonumber(ARGV[4]), n(f[5], 0))
local conc = eff(tonumber(ARGV[5]), n(f[6], 0))
if conc > 0 then conc = math.max(1, math.floor(conc)) end
local avg, est, burst = n(f[7], 1000), math.floor(n(f[8], tonumber(ARGV[6]))), tonumber(ARGV[8])
redis.call('ZREM', S, member)
redis.call('ZREMRANGEBYSCORE', S, '-inf', now)
redis.call('ZREMRANGEBYSCORE', W, '-inf', now)
-- An interactive turn asking again keeps its place among the interactive turns waiting.
local ahead = 0
if interactive then
  local mine = redis.call('ZSCORE', W, member)
  redis.call('ZREM', W, member)
  if mine then ahead = redis.call('ZCOUNT', W, '-inf', '(' .. mine) else ahead = redis.call('ZCARD', W) end
end
local wait, reason, step = 0, '', 1
local held = redis.call('ZCARD', S)
if conc > 0 then
  -- Slots free about `conc` per `avg`, full or not: a turn put back (a fair-share yield too) is
  -- spaced that far, or it would come back after a millisecond and only churn.
  step = avg / conc
  if held >= conc and not pool then wait, reason = step, 'concurrency' end
end
local r_new, t_new = r_tat, t_tat
if rpm > 0 then
  local interval = 60000 / rpm
  r_new = math.max(r_tat, now) + interval
  local w = r_new - math.max(interval, burst) - now
  if w > wait then wait, reason = w, 'rpm' end
  step = math.max(step, interval)
end
if tpm > 0 then
  local cost = est * 60000 / tpm
  t_new = math.max(t_tat, now) + cost
  local w = t_new - math.max(cost, burst) - now
  if w > wait then wait, reason = w, 'tpm' end
  step = math.max(step, cost)
end
-- The service said when it takes requests again (a 429's Retry-After): every sender waits for it.
if hold - now > wait then wait, reason = hold - now, 'rate_limited' end
if wait <= 0 and not interactive then
  local first = redis.call('ZRANGE', W, 0, 0, 'WITHSCORES')
  if first[2] then wait, reason = math.max(tonumber(first[2]) - 2000 - now, 0) + step, 'interactive' end
end
-- Weighted fair share between the tenants whose turns wait in line (start-time fair queueing), within
-- each class: batch turns among batch turns, interactive among interactive (their lines, virtual
-- times and places in B carry the prefix `i`). Each grant moves a tenant's virtual time on by
-- 1/weight, and a tenant ahead of another backlogged one yields the free slot to it. A tenant joining
-- the line starts at the least virtual time of those already there, so time spent idle banks no
-- credit. Only where a limit holds turns back.
local cls = interactive and 'i' or ''
local me = interactive and ('i:' .. tenant) or tenant
local vt, vmin, mine, others = 0, nil, nil, {}
if rpm > 0 or tpm > 0 or conc > 0 then
  redis.call('ZREMRANGEBYSCORE', B, '-inf', now)
  mine = redis.call('ZSCORE', B, me)
  vt = n(redis.call('HGET', F, cls .. 'v:' .. tenant), 0)
  local vts, weights, ends = {}, {}, {}
  local lines = redis.call('ZRANGE', B, 0, -1, 'WITHSCORES')
  for i = 1, #lines, 2 do
    local other = lines[i]
    local theirs = string.sub(other, 1, 2) == 'i:'
    if other ~= me and theirs == interactive then
      local name = theirs and string.sub(other, 3) or other
      local g = redis.call('HMGET', F, cls .. 'v:' .. name, 'w:' .. name)
      vts[name], weights[name] = n(g[1], 0), weight_of(name, g[2])
      ends[name] = tonumber(lines[i + 1]) - BACKLOG_GRACE
      if vmin == nil or vts[name] < vmin then vmin = vts[name] end
    end
  end
  if not mine and vmin ~= nil and vt < vmin then vt = vmin end
  -- Tenants whose batch turns wait in the queue, not taken yet (the list is one FIFO: their first turn
  -- may sit behind thousands of another's), are backlogged too. One not in line yet joins it now
  -- at the least virtual time there (nothing banked while idle, nothing owed either), and stays
  -- while its count holds. A count the queue has moved past (more taken since its last message
  -- was sent than were ahead of it) is a phantom: set to 0, never believed.
  local queued, length = {}, 0
  if Q and not interactive then length = redis.call('LLEN', L) end
  if Q and not interactive and length == 0 then
    -- Nothing waits: a count that has not moved for a while outlived its messages (purged, lost).
    local counts = redis.call('HGETALL', Q)
    local fields = {}
    for i = 1, #counts, 2 do fields[counts[i]] = counts[i + 1] end
    for name, value in pairs(fields) do
      if string.sub(name, 1, 2) == 'c:' and tonumber(value) > 0 then
        if now - n(fields['t:' .. string.sub(name, 3)], 0) > quiet then redis.call('HSET', Q, name, 0) end
      end
    end
  end
  if length > 0 then
    local counts = redis.call('HGETALL', Q)
    local fields = {}
    for i = 1, #counts, 2 do fields[counts[i]] = counts[i + 1] end
    local taken = n(fields['G'], 0)
    for name, value in pairs(fields) do
      if string.sub(name, 1, 2) == 'c:' and tonumber(value) > 0 then
        local other = string.sub(name, 3)
        if taken > n(fields['u:' .. other], 0) + slack then
          redis.call('HSET', Q, name, 0)
        elseif other ~= tenant then
          queued[other] = math.min(tonumber(value), length)
        end
      end
    end
  end
  local total = weight
  for other, count in pairs(queued) do
    if vts[other] == nil then
      local start = vt
      if vmin ~= nil and vmin < start then start = vmin end
      vts[other], weights[other], ends[other] = start, weight_of(other, redis.call('HGET', F, 'w:' .. other)), now
      redis.call('HSET', F, cls .. 'v:' .. other, start)
    end
    redis.call('ZADD', B, 'GT', now + QUEUED_GRACE, other)
  end
  for other, v in pairs(vts) do
    if vmin == nil or v < vmin then vmin = v end
    total = total + weights[other]
  end
  for other, v in pairs(vts) do
    -- A waiting tenant's line runs until its queued turns have had its part of the rate.
    if queued[other] then ends[other] = math.max(ends[other], now + queued[other] * step * total / weights[other]) end
    others[#others + 1] = {ends[other], weights[other]}
  end
  -- Yield to the tenant furthest behind. Under a rate the yielded room stays in the bucket for its
  -- turn; a thread cannot wait, so the workers' threads go only to a tenant behind with a turn in
  -- the queue now: one whose turns are all in their line gets its part from the line's spacing, and
  -- yielding to it would leave the thread idle and send the yielding turn round again.
  local behind = vmin
  if pool then
    behind = nil
    for other in pairs(queued) do
      if behind == nil or vts[other] < behind then behind = vts[other] end
    end
  end
  if wait <= 0 and behind ~= nil and vt > behind + 1e-9 then
    wait, reason = step, 'fair_share'
    redis.call('HINCRBY', F, 'd:' .. tenant, 1)
  end
  redis.call('HSET', F, cls .. 'v:' .. tenant, vt, 'w:' .. tenant, weight)
  redis.call('PEXPIRE', F, 86400000)
end
-- A tenant's line: its turns come back at its weight's part of the limit among the tenants whose
-- lines (of the same class) still run then (a line's end is when its last turn comes back). So a
-- turn placed beyond the others' backlog is spaced for the full rate, and the line is dense once
-- they are done. Returns when the turn comes back.
local function place(from)
  local line = cls .. 'n:' .. tenant
  local back = math.max(from, n(redis.call('HGET', F, line), 0))
  local total = weight
  for _, other in ipairs(others) do
    if other[1] > back then total = total + other[2] end
  end
  local spacing = step * total / weight
  redis.call('HSET', F, line, back + spacing)
  redis.call('ZADD', B, 'GT', back + spacing + BACKLOG_GRACE, me)
  redis.call('PEXPIRE', F, 86400000)
  redis.call('PEXPIRE', B, 86400000)
  return back
end
if wait > 0 then
  if interactive then
    local back = now + wait
    if vmin ~= nil then
      -- Other tenants' interactive turns wait too: the one furthest behind keeps its place, the
      -- others go to their lines.
      if vt <= vmin + 1e-9 and reason ~= 'fair_share' then
        redis.call('ZADD', B, 'GT', back + BACKLOG_GRACE, me)
        redis.call('PEXPIRE', B, 86400000)
      else
        back = place(back)
      end
    elseif reason == 'concurrency' then
      -- When the slot of the turn `ahead` places down the line frees: the holders end about `avg`
      -- after they started (a slot's score is its start + lease), each waiter ahead runs as long.
      local ends, soon = {}, now + math.max(100, math.min(avg / conc, 1000))
      local slots = redis.call('ZRANGE', S, 0, -1, 'WITHSCORES')
      local margin = 50 + avg / 20  -- come back just after the release, not just before it
      for i = 2, #slots, 2 do ends[#ends + 1] = math.max(tonumber(slots[i]) - lease + avg + margin, soon) end
      table.sort(ends)
      local count, start = #ends, now
      for _ = 0, math.min(ahead, 200) do
        while count >= conc and #ends > 0 do start = table.remove(ends, 1); count = count - 1 end
        count = count + 1
        local fin, at = start + avg + margin, #ends + 1
        for i, e in ipairs(ends) do if e > fin then at = i; break end end
        table.insert(ends, at, fin)
      end
      back = math.max(back, start + math.max(ahead - 200, 0) * step)
    else
      back = back + ahead * step
    end
    if vmin == nil and (rpm > 0 or tpm > 0 or conc > 0) then
      -- Alone in its class, the tenant's waiting turns still mark it backlogged until the last
      -- comes back, so a tenant arriving later joins a line instead of queueing behind them all.
      redis.call('ZADD', B, 'GT', back + BACKLOG_GRACE, me)
      redis.call('PEXPIRE', B, 86400000)
    end
    redis.call('ZADD', W, back + 2000, member)
    redis.call('PEXPIRE', W, 86400000)
    return {0, math.ceil(back - now), reason, held, est}
  end
  -- A turn of the line that came back a little before the bucket had room for it (its delivery
  -- jitters) keeps its place and waits the rest; sent to the back, it would leave its slot unused.
  if (reason == 'rpm' or reason == 'tpm') and wait <= math.min(burst, step) / 2 then
    return {0, math.ceil(wait), reason, held, est}
  end
  -- The tenant furthest behind its share keeps its place too: the others yield the next slot to it.
  if vmin ~= nil and vt <= vmin + 1e-9 and (reason == 'rpm' or reason == 'tpm' or reason == 'concurrency') then
    redis.call('ZADD', B, 'GT', now + wait + BACKLOG_GRACE, tenant)
    redis.call('PEXPIRE', B, 86400000)
    return {0, math.ceil(wait), reason, held, est}
  end
  local back = place(now + wait)
  return {0, math.ceil(back - now), reason, held, est}
end
if rpm > 0 then redis.call('HSET', H, 'r_tat', r_new) end
if tpm > 0 then redis.call('HSET', H, 't_tat', t_new) end
redis.call('HSET', F, cls .. 'v:' .. tenant, vt + 1 / weight, 'w:' .. tenant, weight)
redis.call('PEXPIRE', F, 86400000)
redis.call('HINCRBY', F, 'g:' .. tenant, 1)
redis.call('ZADD', S, now + lease, member)
redis.call('ZADD', R, now, member .. ':' .. now)
redis.call('ZREMRANGEBYSCORE', R, '-inf', now - 10000)
-- The scope's own keys only: never the queue's list (KEYS[8]), nor its counts (kept by worker.tenant_queue).
for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], 86400000) end
return {1, 0, '', held + 1, est}
"""
)

# KEYS: slots, tenants' shares. ARGV: member, tenant, weight.
# A slot given back unused (the turn could not run after all): the grant is undone, its virtual time too.
GIVE_BACK = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[2], 'v:' .. ARGV[2], -1 / tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[2], 'g:' .. ARGV[2], -1)
end
return 1
"""

# KEYS: hash, slots, sent log. ARGV: member, outcome (ok|other), ms, estimate, tokens, cfg tpm.
RELEASE = (
    _PRELUDE
    + f"local INCREASE_RPM = {INCREASE_RPM}\n"
    + """
local H, S, R = KEYS[1], KEYS[2], KEYS[3]
redis.call('ZREM', S, ARGV[1])
local f = redis.call('HMGET', H, 'avg_ms', 'est', 't_tat', 'a_tpm', 'a_rpm', 'a_conc', 'ceil_rpm', 'ceil_tpm')
local ok, ms, estimate, tokens = ARGV[2] == 'ok', tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not ok then return 0 end
redis.call('HSET', H, 'avg_ms', 0.8 * n(f[1], ms) + 0.2 * ms)
if tokens > 0 then
  redis.call('HSET', H, 'est', 0.8 * n(f[2], tokens) + 0.2 * tokens)
  local tpm = eff(tonumber(ARGV[6]), n(f[4], 0))
  if tpm > 0 and f[3] then redis.call('HSET', H, 't_tat', tonumber(f[3]) + (tokens - estimate) * 60000 / tpm) end
end
local measured = redis.call('ZCOUNT', R, now - 10000, '+inf') * 6
local a_rpm, a_tpm, a_conc = n(f[5], 0), n(f[4], 0), n(f[6], 0)
if a_rpm > 0 then
  local cap = n(f[7], 0) > 0 and 0.97 * tonumber(f[7]) or math.max(2 * measured, 10)
  redis.call('HSET', H, 'a_rpm', math.min(a_rpm + INCREASE_RPM, math.max(cap, a_rpm)))
end
if a_tpm > 0 and tokens > 0 then
  local cap = n(f[8], 0) > 0 and 0.97 * tonumber(f[8]) or a_tpm * 2
  redis.call('HSET', H, 'a_tpm', math.min(a_tpm + math.max(a_tpm / 3000, tokens / 100), math.max(cap, a_tpm)))
end
if a_conc > 0 then
  local cap = redis.call('ZCARD', S) + 2
  redis.call('HSET', H, 'a_conc', math.min(a_conc + 1 / a_conc, math.max(cap, a_conc)))
end
return 1
"""
)

# KEYS: hash, slots, sent log. ARGV: kind (rate_limited|overloaded), limit rpm, limit tpm, beta, wait ms.
THROTTLED = (
    _PRELUDE
    + """
local H, S, R = KEYS[1], KEYS[2], KEYS[3]
local f = redis.call('HMGET', H, 'a_rpm', 'a_tpm', 'a_conc', 'last_dec', 'avg_ms', 'hold')
local a_rpm, a_tpm, a_conc, avg, hold = n(f[1], 0), n(f[2], 0), n(f[3], 0), n(f[5], 1000), n(f[6], 0)
local kind, l_rpm, l_tpm, beta = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local wait = tonumber(ARGV[5])
redis.call('PEXPIRE', H, 86400000)
-- The limits the service names are its own: the fleet goes to 95% of them, and a 429 that names
-- them says the service's budget is spent until its reset, not that the fleet's rate is too high.
local set_rpm, set_tpm = false, false
if l_rpm > 0 then
  redis.call('HSET', H, 'ceil_rpm', l_rpm)
  if a_rpm == 0 or a_rpm > 0.95 * l_rpm then a_rpm, set_rpm = 0.95 * l_rpm, true end
  redis.call('HSET', H, 'a_rpm', a_rpm)
end
if l_tpm > 0 then
  redis.call('HSET', H, 'ceil_tpm', l_tpm)
  if a_tpm == 0 or a_tpm > 0.95 * l_tpm then a_tpm, set_tpm = 0.95 * l_tpm, true end
  redis.call('HSET', H, 'a_tpm', a_tpm)
end
-- Every sender waits until the service takes requests again (a hold only ever grows).
local paused = now < hold
if kind == 'rate_limited' and wait > 0 and now + wait > hold then redis.call('HSET', H, 'hold', now + wait) end
-- Lower nothing from a refusal of a request that left before the fleet was held, nor from a rate
-- measured over time the fleet spent holding back: what it sent then is its own doing.
local since = math.max(now - 10000, math.min(hold, now))
if paused or now - since < 5000 then return {a_rpm, a_tpm, a_conc} end
if now - n(f[4], 0) < math.max(1000, avg) then return {a_rpm, a_tpm, a_conc} end
local sent = redis.call('ZCOUNT', R, since, '+inf')
local measured = sent * 60000 / (now - since)
local held = redis.call('ZCARD', S)
-- A refusal at a trickle says nothing about the fleet's rate (the key may be busy elsewhere):
-- the turn waits out Retry-After, and the limits stay as they are.
if sent < 5 then return {a_rpm, a_tpm, a_conc} end
local named = l_rpm > 0 or l_tpm > 0
if kind == 'rate_limited' then
  -- Refused again at (or below) a named limit, or with none named: 15% below what was really sent.
  if not set_rpm and (l_rpm > 0 or not named) then
    local base = measured
    if a_rpm > 0 then base = math.min(a_rpm, math.max(measured, 1)) end
    a_rpm = math.max(1, beta * base)
    redis.call('HSET', H, 'a_rpm', a_rpm)
  end
  if l_tpm > 0 and not set_tpm then
    a_tpm = math.max(100, beta * a_tpm)
    redis.call('HSET', H, 'a_tpm', a_tpm)
  end
end
if kind == 'overloaded' or (kind == 'rate_limited' and not named) then
  local base = held
  if a_conc > 0 then base = math.min(a_conc, math.max(held, 1)) end
  local floor = 1
  if a_rpm > 0 then floor = math.ceil(a_rpm / 60 * avg / 1000) + 1 end
  a_conc = math.max(floor, math.floor(beta * base))
  redis.call('HSET', H, 'a_conc', a_conc)
end
redis.call('HSET', H, 'last_dec', now)
return {a_rpm, a_tpm, a_conc}
"""
)

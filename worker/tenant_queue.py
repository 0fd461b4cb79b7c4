"""How many batch turn messages of each tenant wait in the `chatq.batch` list (sent, not yet taken).

The workers' thread share (`worker.runtime.policy.threads`) needs to know which tenants wait
before their first turn is taken: the list is one FIFO, so a tenant whose 300 turns sit behind
another's 3,000 would otherwise look idle until those 3,000 had all been granted. The count rides
on the sent-markers (`worker.markers`): a counted message's marker holds `t:<tenant>` instead of
`1`, the count goes up when such a marker is set (not when it is merely set again) and down when a
worker takes the message and drops the marker. So it is symmetric by construction: a send that was
not counted (a marker `1`) is not uncounted at its take, whatever path sent it.

One hash, `chatq:fleet:queued`, kept by the scripts below (atomic, on Redis's clock):

- `c:<tenant>`: the tenant's messages waiting;
- `u:<tenant>`: how many batch messages the workers will have taken (`G`) once its newest message
  is taken: the list's length ahead of it plus `G` when it was sent. The list is FIFO, so once the
  workers have taken more than that (plus `QUEUE_SLACK`), a count still above 0 is a phantom (a
  marker that outlived its message: a deleted session, a purged queue, a worker that died between
  taking a message and receiving it), and `worker.runtime.policy.limits` no longer believes it and
  sets it to 0. A phantom therefore never holds another tenant back for longer than the list needs
  to move past where its last message was;
- `G`: batch messages taken so far (every take of `chatq.batch`, counted or not: the one call the
  take makes anyway, a script instead of a `DEL`);
- `t:<tenant>`: when its count last moved (ms, Redis's clock). A count that has not moved for
  `QUIET_MS` while the list is empty is a phantom too (every message sent before is gone), the
  case `u:` misses when messages left the list without being taken (a purge, a deleted list); so
  is one of a tenant that has no batch turn `queued` in Postgres at all, which every sweep checks
  (`forget_idle`: sessions deleted, turns cancelled).

Sessions without a tenant and interactive turns are never counted: their sends and takes make the
same Redis calls as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import redis
from redis import RedisError

from worker.payload import BATCH_QUEUE

__all__ = [
    "QUEUED_KEY",
    "QUEUE_SLACK",
    "QUIET_MS",
    "count_sent",
    "drop_unsent",
    "forget_idle",
    "take_from_batch",
    "waiting",
]

QUEUED_KEY = "chatq:fleet:queued"
"""The hash of each tenant's waiting batch messages (fields above)."""
QUIET_MS = 2000
"""A count that has not moved for this long while `chatq.batch` is empty is not believed."""
QUEUE_SLACK = 128
"""Takes past a tenant's expected last one before its count is taken for a phantom: other senders'
messages pushed between a marker and its send, and takes that were never counted, move the real
place of a message back a little."""
DAY_MS = 86_400_000

# KEYS: the counts, the batch list, then one sent-marker per message. ARGV: marker TTL (s), then one tenant each.
_COUNT_SENT = f"""
local Q, L, ttl = KEYS[1], KEYS[2], tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local taken = tonumber(redis.call('HGET', Q, 'G') or '0')
local ahead = redis.call('LLEN', L)
for i = 3, #KEYS do
  local tenant = ARGV[i - 1]
  local value = 't:' .. tenant
  local old = redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], value, 'EX', ttl)
  -- Set again (a sweep's re-send of a message still waiting): one marker, one take, counted once.
  if old ~= value then redis.call('HINCRBY', Q, 'c:' .. tenant, 1) end
  ahead = ahead + 1
  redis.call('HSET', Q, 'u:' .. tenant, taken + ahead, 't:' .. tenant, now)
end
redis.call('PEXPIRE', Q, {DAY_MS})
return 1
"""

# KEYS: the counts, a sent-marker. ARGV: '1' for a take (counted in G), '0' for a send that failed.
_UNCOUNT = f"""
local value = redis.call('GET', KEYS[2])
if value then redis.call('DEL', KEYS[2]) end
if ARGV[1] == '1' then redis.call('HINCRBY', KEYS[1], 'G', 1) end
if value and string.sub(value, 1, 2) == 't:' then
  local tenant = string.sub(value, 3)
  local clock = redis.call('TIME')
  local field = 'c:' .. tenant
  if redis.call('HINCRBY', KEYS[1], field, -1) < 0 then redis.call('HSET', KEYS[1], field, 0) end
  redis.call('HSET', KEYS[1], 't:' .. tenant, tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
end
redis.call('PEXPIRE', KEYS[1], {DAY_MS})
return 1
"""

# KEYS: the counts. ARGV: quiet ms, then the tenants that have batch turns queued in Postgres.
_FORGET_IDLE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local busy, dropped = {}, 0
for i = 2, #ARGV do busy[ARGV[i]] = true end
local counts = redis.call('HGETALL', KEYS[1])
local fields = {}
for i = 1, #counts, 2 do fields[counts[i]] = counts[i + 1] end
for name, value in pairs(fields) do
  local tenant = string.sub(name, 3)
  if string.sub(name, 1, 2) == 'c:' and tonumber(value) > 0 and not busy[tenant]
      and now - tonumber(fields['t:' .. tenant] or '0') > tonumber(ARGV[1]) then
    redis.call('HSET', KEYS[1], name, 0)
    dropped = dropped + 1
  end
end
return dropped
"""

_scripts: dict[str, tuple[Any, Any]] = {}


def _script(client: Any, name: str, source: str) -> Any:
    cached = _scripts.get(name)
    if cached is None or cached[0] is not client:
        cached = (client, client.register_script(source))
        _scripts[name] = cached
    return cached[1]


def count_sent(pipe: Any, client: redis.Redis, markers: Mapping[str, str], *, ttl: int) -> None:
    """Queue on `pipe` (a pipeline of `client`) setting the markers (key -> tenant) of counted batch messages."""
    if markers:
        keys = list(markers)
        _script(client, "count_sent", _COUNT_SENT)(
            keys=[QUEUED_KEY, BATCH_QUEUE, *keys], args=[ttl, *(markers[key] for key in keys)], client=pipe
        )


def take_from_batch(client: redis.Redis, marker: str) -> None:
    """A worker took a `chatq.batch` message: drop its marker, count the take, uncount its tenant's (best effort)."""
    with contextlib.suppress(RedisError):
        _script(client, "uncount", _UNCOUNT)(keys=[QUEUED_KEY, marker], args=["1"])


def drop_unsent(client: redis.Redis, markers: list[str]) -> None:
    """Messages that could not be sent: drop their markers and uncount them (best effort)."""
    with contextlib.suppress(RedisError):
        pipe = client.pipeline(transaction=False)
        for marker in markers:
            _script(client, "uncount", _UNCOUNT)(keys=[QUEUED_KEY, marker], args=["0"], client=pipe)
        pipe.execute()


def forget_idle(client: redis.Redis, queued: set[str]) -> int:
    """The sweep's check against Postgres: the counts of tenants with no batch turn `queued` there
    (`queued`: those that have one), not moved for `QUIET_MS`, are phantoms; set to 0. Returns how many."""
    return int(_script(client, "forget_idle", _FORGET_IDLE)(keys=[QUEUED_KEY], args=[QUIET_MS, *sorted(queued)]))


def waiting(client: redis.Redis) -> dict[str, int]:
    """Each tenant's counted batch messages waiting now, as the hash says (phantoms included)."""
    found: dict[str, int] = {}
    for field, value in (client.hgetall(QUEUED_KEY) or {}).items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        if name.startswith("c:") and int(value) > 0:
            found[name[2:]] = int(value)
    return found

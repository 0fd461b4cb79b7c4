"""The Redis scripts behind stream events (`worker.events`), and the keys that make a turn's terminal
event exactly one (docs/contract.md, "Stream events").

A terminal event (`final`, `error`, `cancelled`) is published only by `PUBLISH_TERMINAL`, which
first takes the turn's ended-marker (`SET NX`): whoever takes it (the turn's worker, a producer's
cancel, or the sweep repairing an event its publisher died before sending) publishes; anyone
after it publishes nothing. A turn that may end is first put in the unended set (`UNENDED`): its
`started` event does that, and so does a cancel before it commits; the terminal script takes it
out again. What stays there is a turn whose terminal event never came, and the sweep looks only
at those (`worker.runtime.recovery.terminal_repair`), never at the whole turns table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from chatq.shortcuts.redis_resp import Arg, roundtrip

UNENDED = "chatq:unended"
"""Sorted set of turns that may end but whose terminal event is not out yet, scored by when
they were added (or last found still unfinished by the sweep), in Unix seconds."""


def ended_marker(turn_id: object) -> str:
    """The key whose existence says a turn's terminal event was published (kept as long as its stream)."""
    return f"chatq:ended:{turn_id}"


# Sets `seq` to one more than the newest event's in the stream KEYS[1] (0 if none).
_NEXT_SEQ = """
local seq = 0
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if newest[1] then
  local fields = newest[1][2]
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'event' then
      local ok, event = pcall(cjson.decode, fields[i + 1])
      local number = ok and type(event) == 'table' and tonumber(event.seq)
      if number then seq = math.floor(number) end
    end
  end
end
seq = seq + 1
"""

# Numbers an event after the newest one in the turn's stream and publishes it (PUBLISH, XADD,
# EXPIRE, as `TurnEvents.send`), atomically and in one round trip instead of an XREVRANGE and then
# a publish; a `started` event also adds the turn to the unended set. KEYS[1]: the stream, KEYS[2]:
# the unended set. ARGV: the channel, the retention, the event's JSON before and after the seq's
# value, and the turn id and score to add to the set ('' for none).
NUMBER_AND_PUBLISH = (
    _NEXT_SEQ
    + """
local event = ARGV[3] .. string.format('%d', seq) .. ARGV[4]
redis.call('PUBLISH', ARGV[1], event)
redis.call('XADD', KEYS[1], '*', 'event', event)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[2], 'NX', ARGV[6], ARGV[5]) end
return seq
"""
)

# Publishes a turn's terminal event unless one was published already: returns 0 if one was, else
# the event's seq. KEYS[1]: the stream, KEYS[2]: the turn's ended-marker, KEYS[3]: the unended set.
# ARGV: the channel, the retention, the turn id, the event's JSON and its seq; or, to number it
# after the newest event in the stream, the JSON before the seq's value, and '' and the JSON
# after it.
PUBLISH_TERMINAL = (
    """
redis.call('ZREM', KEYS[3], ARGV[3])
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then return 0 end
local event = ARGV[4]
local published = tonumber(ARGV[5])
if not published then
"""
    + _NEXT_SEQ
    + """
  event = ARGV[4] .. string.format('%d', seq) .. ARGV[6]
  published = seq
end
redis.call('PUBLISH', ARGV[1], event)
redis.call('XADD', KEYS[1], '*', 'event', event)
redis.call('EXPIRE', KEYS[1], ARGV[2])
return published
"""
)

NUMBER_AND_PUBLISH_SHA = hashlib.sha1(NUMBER_AND_PUBLISH.encode()).hexdigest()
PUBLISH_TERMINAL_SHA = hashlib.sha1(PUBLISH_TERMINAL.encode()).hexdigest()
_SOURCES = {NUMBER_AND_PUBLISH_SHA: NUMBER_AND_PUBLISH, PUBLISH_TERMINAL_SHA: PUBLISH_TERMINAL}


def split_at_seq(payload: str, seq: int) -> tuple[str, str]:
    """An event's JSON cut where its seq's value goes: (head ending in `"seq":`, tail from the comma)."""
    head, _, tail = payload.partition(f'"seq":{seq},')
    return head + '"seq":', "," + tail


def terminal_arguments(
    *, stream: str, channel: str, turn_id: str, retention: int, payload: str, seq: int | None = None, tail: str = ""
) -> tuple[Arg, ...]:
    """EVALSHA's arguments after the SHA for `PUBLISH_TERMINAL`: the event `payload` with its `seq`;
    or, with `seq` None, the head and `tail` of `split_at_seq`, to be numbered in Redis."""
    numbered: tuple[Arg, ...] = (payload, seq) if seq is not None else (payload, "", tail)
    return (3, stream, ended_marker(turn_id), UNENDED, channel, retention, turn_id, *numbered)


def run_script(
    client: redis.Redis, sha: str, calls: Sequence[Sequence[Arg]], before: Iterable[Sequence[Arg]] = ()
) -> list[Any]:
    """Plain commands `before`, then the script `sha` once per arguments in `calls`, in one round
    trip; the script's replies.

    A Redis that lacks the script (new or restarted) refuses it with NOSCRIPT, and then refused
    every call of it: they go again as EVAL, which runs and caches it (the commands before them
    already ran).
    """
    commands: list[Sequence[Arg]] = list(before)
    first = len(commands)
    commands.extend(("EVALSHA", sha, *arguments) for arguments in calls)
    try:
        return roundtrip(client, commands)[first:]
    except redis.exceptions.NoScriptError:
        return roundtrip(client, [("EVAL", _SOURCES[sha], *arguments) for arguments in calls])


def add_unended(client: redis.Redis, turn_ids: Iterable[object], *, now: float) -> None:
    """Put turns in the unended set (kept where they are if there already)."""
    members: list[Arg] = []
    for turn_id in turn_ids:
        members.extend((f"{now:.3f}", str(turn_id)))
    if members:
        roundtrip(client, [("ZADD", UNENDED, "NX", *members)])

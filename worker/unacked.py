"""Turn messages kombu holds as taken but never acknowledged: the sweeper's view of them.

kombu's Redis transport moves a message it takes from a queue into the `unacked` hash (field: the
delivery tag; value: the JSON list [message, exchange, routing key]) and notes when in the
`unacked_index` sorted set. The message goes back to its queue only when the taking worker closes
its channel cleanly, or, after the visibility timeout (an hour, celeryconfig.py), when a worker
restores it. A worker that stops (or dies) between taking a message and handing it to Celery
leaves it there: its turn is still `queued`, and its sent-marker was never dropped (a worker drops
it on receipt, worker/ops/signals.py), so the marker alone would say "still waiting in the queue".
The sweeper asks this module which marked turns are in fact stuck here, re-sends them and forgets
the stuck copies (`forget`), so a queued turn runs again within the grace, not an hour later.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection
from typing import Any

import redis

__all__ = ["UNACKED", "UNACKED_INDEX", "forget", "taken_long_ago"]

UNACKED = "unacked"
"""kombu's hash of taken, unacknowledged messages (its default name; celeryconfig.py keeps it)."""
UNACKED_INDEX = "unacked_index"
"""kombu's sorted set of their delivery tags, scored by when each was taken (epoch seconds)."""
SCAN_LIMIT = 1000
"""Messages looked at per sweep; older ones first (running turns hold theirs until they end)."""


def taken_long_ago(
    client: redis.Redis, turn_ids: Collection[uuid.UUID], *, older_than: float
) -> dict[uuid.UUID, list[bytes]]:
    """Which of these turns have a message taken more than `older_than` seconds ago and never
    acknowledged: turn id -> the delivery tags of those copies."""
    if not turn_ids:
        return {}
    tags: list[Any] = client.zrangebyscore(UNACKED_INDEX, "-inf", time.time() - older_than, start=0, num=SCAN_LIMIT)
    if not tags:
        return {}
    wanted = {str(turn_id): turn_id for turn_id in turn_ids}
    found: dict[uuid.UUID, list[bytes]] = {}
    for tag, raw in zip(tags, client.hmget(UNACKED, tags), strict=True):
        turn_id = wanted.get(_task_id(raw)) if raw is not None else None
        if turn_id is not None:
            found.setdefault(turn_id, []).append(tag)
    return found


def forget(client: redis.Redis, tags: Collection[bytes]) -> None:
    """Drop these copies from kombu's unacknowledged set (their turns were sent again)."""
    if tags:
        pipe = client.pipeline(transaction=True)
        pipe.hdel(UNACKED, *tags)
        pipe.zrem(UNACKED_INDEX, *tags)
        pipe.execute()


def _task_id(raw: bytes | str) -> str:
    """The task id (for chatq.run_turn: the turn id) of an `unacked` entry; "" if it has none."""
    try:
        message = json.loads(raw)[0]
        return str(message["headers"]["id"])
    except (ValueError, TypeError, KeyError, IndexError):
        return ""

"""Sent-markers: Redis keys that say a turn's task message is waiting in the queue.

The sweeper reads a queued turn without a marker as "its message was lost" and sends it again;
a worker drops the marker when it takes the message (`worker.ops.signals`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence

from redis import RedisError

from worker.events import get_redis

__all__ = ["SENT_MARKER_TTL", "in_queue", "mark_taken", "sent_marker", "set_markers"]

SENT_MARKER_TTL = 24 * 3600


def sent_marker(turn_id: object) -> str:
    """Redis key that exists while a turn's message waits in the queue.

    It lives in the broker's own Redis, so it disappears exactly when the message would (a flush or
    a restart of a Redis that keeps nothing on disk): the sweeper reads "no marker" as "message lost".
    """
    return f"chatq:sent:{turn_id}"


def mark_taken(turn_id: object) -> None:
    """A worker took the turn's message off the queue (best effort)."""
    with contextlib.suppress(RedisError):
        get_redis().delete(sent_marker(turn_id))


def in_queue(turn_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these turns still have a message waiting in Redis (as far as the markers tell)."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        for turn_id in turn_ids:
            pipe.exists(sent_marker(turn_id))
        found = pipe.execute()
    except RedisError:
        return set()
    return {turn_id for turn_id, exists in zip(turn_ids, found, strict=True) if exists}


def set_markers(turn_ids: Sequence[str]) -> None:
    """Mark messages as waiting in the queue (best effort: without a marker the sweeper may later
    send a harmless duplicate)."""
    if not turn_ids:
        return
    with contextlib.suppress(RedisError):
        pipe = get_redis().pipeline(transaction=False)
        for turn_id in turn_ids:
            pipe.set(sent_marker(turn_id), "1", ex=SENT_MARKER_TTL)
        pipe.execute()

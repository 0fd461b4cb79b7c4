"""Sent-markers: Redis keys that say a turn's task message is waiting in the queue.

The sweeper reads a queued turn without a marker as "its message was lost" and sends it again;
a worker drops the marker when it takes the message (`worker.ops.signals`). A marker outlives its
message when the worker that took the message stopped before Celery received it (the message is
then stuck in kombu's `unacked` hash, `worker.unacked`) or when the message was lost on
its way out of Redis: `still_waiting` does not believe a marker in either case.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence

import redis
from redis import RedisError

from worker import tenant_queue, unacked
from worker.payload import BATCH_QUEUE, QUEUES

__all__ = ["SENT_MARKER_TTL", "in_queue", "mark_taken", "sent_marker", "set_markers", "still_waiting"]

SENT_MARKER_TTL = 24 * 3600


def sent_marker(turn_id: object) -> str:
    """Redis key that exists while a turn's message waits in the queue.

    It lives in the broker's own Redis, so it disappears exactly when the message would (a flush or
    a restart of a Redis that keeps nothing on disk): the sweeper reads "no marker" as "message lost".
    """
    return f"chatq:sent:{turn_id}"


def mark_taken(client: redis.Redis, turn_id: object, *, queue: str | None = None) -> None:
    """A worker took the turn's message off `queue` (best effort). Off `chatq.batch` the take is also
    counted for the tenants' waiting batch messages (`worker.tenant_queue`): the same one call."""
    if queue == BATCH_QUEUE:
        tenant_queue.take_from_batch(client, sent_marker(turn_id))
        return
    with contextlib.suppress(RedisError):
        client.delete(sent_marker(turn_id))


def in_queue(client: redis.Redis, turn_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these turns still have a message waiting in Redis (as far as the markers tell)."""
    try:
        pipe = client.pipeline(transaction=False)
        for turn_id in turn_ids:
            pipe.exists(sent_marker(turn_id))
        found = pipe.execute()
    except RedisError:
        return set()
    return {turn_id for turn_id, exists in zip(turn_ids, found, strict=True) if exists}


def set_markers(client: redis.Redis, turn_ids: Sequence[str], tenants: Mapping[str, str] | None = None) -> None:
    """Mark messages as waiting in the queue (best effort: without a marker the sweeper may later
    send a harmless duplicate). `tenants` (turn id -> tenant): batch messages of tenants' sessions,
    whose markers also count them as waiting for their tenant (`worker.tenant_queue`), in the same
    round trip."""
    if not turn_ids:
        return
    counted = tenants or {}
    with contextlib.suppress(RedisError):
        pipe = client.pipeline(transaction=False)
        for turn_id in turn_ids:
            if turn_id not in counted:
                pipe.set(sent_marker(turn_id), "1", ex=SENT_MARKER_TTL)
        tenant_queue.count_sent(
            pipe,
            client,
            {sent_marker(turn_id): counted[turn_id] for turn_id in turn_ids if turn_id in counted},
            ttl=SENT_MARKER_TTL,
        )
        pipe.execute()


def still_waiting(
    client: redis.Redis,
    turn_ids: Sequence[uuid.UUID],
    *,
    grace: float,
    stuck: dict[uuid.UUID, list[bytes]] | None = None,
) -> set[uuid.UUID]:
    """Which of these turns' messages are waiting in a queue, as far as Redis can tell (the sweeper's view).

    A marked turn is not waiting when its message was taken more than `grace` seconds ago and never
    acknowledged (its worker stopped before Celery received it: those copies go into `stuck`, for
    the sweeper to forget once it sent the turn again), nor when its marker is older than `grace`
    while no chatq queue holds any message at all (the message was lost on its way to a worker).
    """
    marked = in_queue(client, turn_ids)
    if not marked:
        return marked
    try:
        taken = unacked.taken_long_ago(client, marked, older_than=grace)
        if stuck is not None:
            stuck.update(taken)
        marked.difference_update(taken)
        if marked and not any(client.llen(queue) for queue in QUEUES):
            pipe = client.pipeline(transaction=False)
            ordered = list(marked)
            for turn_id in ordered:
                pipe.pttl(sent_marker(turn_id))
            left = pipe.execute()
            # A marker's age is what its TTL lost since it was set.
            marked = {
                turn_id
                for turn_id, ms in zip(ordered, left, strict=True)
                if ms > 0 and SENT_MARKER_TTL - ms / 1000 < grace
            }
    except RedisError:
        return marked
    return marked

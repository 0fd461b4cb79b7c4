"""A queued turn whose message left the queue but never reached Celery runs again within the grace.

Issue 34: a worker stopped right after it took a handed-back turn's message left that message in
kombu's `unacked` hash (returned only after the visibility timeout, an hour) with the turn's
sent-marker still set, so the sweeper believed the message was waiting and nothing ran the turn.
Here the worker's part is played by hand, exactly as kombu's Redis transport does it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import func, update

from chatq.settings import reset_settings
from models.db import session_scope
from models.tables import Turn
from tests.support.inprocess import build_runtime
from worker.markers import SENT_MARKER_TTL, sent_marker
from worker.producer import create_session, submit_turn
from worker.runtime.recovery.sweeper import sweep_once
from worker.unacked import UNACKED, UNACKED_INDEX

GRACE = 2.0


@pytest.fixture
def client(chatq_env: dict[str, str]) -> Iterator[redis.Redis]:
    os.environ["CHATQ_REQUEUE_GRACE"] = str(GRACE)
    reset_settings()
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    client.delete("chatq", "chatq.batch")
    yield client
    client.delete("chatq", "chatq.batch")
    client.close()
    os.environ.pop("CHATQ_REQUEUE_GRACE", None)
    reset_settings()


def _queued(client: redis.Redis, turn_id: uuid.UUID) -> int:
    return sum(json.loads(raw)["headers"]["id"] == str(turn_id) for raw in client.lrange("chatq", 0, -1))


def _submitted_long_ago(client: redis.Redis) -> uuid.UUID:
    """A runnable queued turn sent more than the grace ago, its message still in the queue."""
    turn = submit_turn(create_session(framework="none", model="echo"), "hello")
    with session_scope() as db:
        db.execute(
            update(Turn).where(Turn.id == turn.turn_id).values(enqueued_at=func.now() - timedelta(seconds=GRACE * 5))
        )
    assert _queued(client, turn.turn_id) == 1
    return turn.turn_id


def _taken_by_a_worker_that_stopped(client: redis.Redis, turn_id: uuid.UUID, *, seconds_ago: float) -> str:
    """What kombu does on taking a message (BRPOP, then unacked + unacked_index), and no more."""
    raw: Any = client.rpop("chatq")
    assert raw is not None and json.loads(raw)["headers"]["id"] == str(turn_id)
    message = json.loads(raw)
    tag = str(uuid.uuid4())
    message["properties"]["delivery_tag"] = tag
    client.hset(UNACKED, tag, json.dumps([message, "chatq", "chatq"]))
    client.zadd(UNACKED_INDEX, {tag: time.time() - seconds_ago})
    return tag


def test_a_message_stuck_unacknowledged_with_its_marker_set_is_resent_within_the_grace(client: redis.Redis) -> None:
    turn_id = _submitted_long_ago(client)
    tag = _taken_by_a_worker_that_stopped(client, turn_id, seconds_ago=GRACE + 1)
    assert client.exists(sent_marker(turn_id))  # Celery never received it: nobody dropped the marker

    sweep_once(build_runtime())

    assert _queued(client, turn_id) == 1, "the stuck turn was not sent again"
    # The stuck copy is gone, so it does not come back as a duplicate after the visibility timeout.
    assert not client.hexists(UNACKED, tag) and client.zscore(UNACKED_INDEX, tag) is None
    sweep_once(build_runtime())
    assert _queued(client, turn_id) == 1  # sent once, not at every sweep


def test_a_message_taken_within_the_grace_is_left_to_its_worker(client: redis.Redis) -> None:
    turn_id = _submitted_long_ago(client)
    tag = _taken_by_a_worker_that_stopped(client, turn_id, seconds_ago=0.0)
    try:
        sweep_once(build_runtime())
        assert _queued(client, turn_id) == 0  # a live worker receives what it took within milliseconds
        assert client.hexists(UNACKED, tag)
    finally:
        client.hdel(UNACKED, tag)
        client.zrem(UNACKED_INDEX, tag)


def test_a_marker_older_than_the_grace_with_no_message_anywhere_is_not_believed(client: redis.Redis) -> None:
    turn_id = _submitted_long_ago(client)
    client.delete("chatq")  # taken off the queue and lost on the way (BRPOP answered, never read)
    client.expire(sent_marker(turn_id), SENT_MARKER_TTL - int(GRACE * 2))  # set 4 s ago

    sweep_once(build_runtime())

    assert _queued(client, turn_id) == 1

"""The sweeper against real Postgres and Redis, with no worker consuming (so queues can be read)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from sqlalchemy import func, update

from chatq.settings import reset_settings
from models.db import session_scope
from models.tables import Turn, TurnStatus
from tests.support.inprocess import build_runtime
from worker.producer import create_session, submit_turn
from worker.runtime.recovery.sweeper import sweep_once


@pytest.fixture
def zero_grace(chatq_env: dict[str, str]) -> Iterator[redis.Redis]:
    os.environ["CHATQ_REQUEUE_GRACE"] = "0"
    reset_settings()
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    client.delete("chatq", "chatq.batch")
    yield client
    client.delete("chatq", "chatq.batch")
    client.close()
    os.environ.pop("CHATQ_REQUEUE_GRACE", None)
    reset_settings()


def queued_ids(client: redis.Redis, *only: uuid.UUID, queue: str = "chatq") -> list[str]:
    """Task ids waiting in a queue, limited to `only` (other tests may leave unfinished turns behind)."""
    wanted = {str(turn_id) for turn_id in only}
    ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]
    return [i for i in ids if i in wanted] if wanted else ids


def test_a_waiting_message_is_not_multiplied_but_a_lost_one_is_resent(zero_grace: redis.Redis) -> None:
    client = zero_grace
    session_id = create_session(framework="none", model="echo")
    turn = submit_turn(session_id, "hello")
    assert queued_ids(client, turn.turn_id) == [str(turn.turn_id)]
    # The message is still waiting in Redis: the sweeper leaves it alone, however often it runs.
    for _ in range(3):
        sweep_once(build_runtime())
    assert queued_ids(client, turn.turn_id) == [str(turn.turn_id)]
    # Redis lost everything (it keeps nothing on disk): now the turn is sent again, once.
    client.flushdb()
    report = sweep_once(build_runtime())
    assert report.resent >= 1
    assert queued_ids(client, turn.turn_id) == [str(turn.turn_id)]
    sweep_once(build_runtime())
    assert queued_ids(client, turn.turn_id) == [str(turn.turn_id)]


def test_an_expired_lease_is_released_and_resent(zero_grace: redis.Redis) -> None:
    client = zero_grace
    session_id = create_session(framework="none", model="echo")
    turn = submit_turn(session_id, "my worker died")
    client.delete("chatq")
    with session_scope() as db:
        db.execute(
            update(Turn)
            .where(Turn.id == turn.turn_id)
            .values(
                status=TurnStatus.RUNNING,
                lease_token=uuid.uuid4(),
                lease_expires_at=func.now() - timedelta(seconds=1),
                deliveries=1,
                attempts=1,
            )
        )
    report = sweep_once(build_runtime())
    assert report.expired_leases == 1
    with session_scope() as db:
        row = db.get(Turn, turn.turn_id)
        assert row is not None and row.status is TurnStatus.QUEUED and row.lease_token is None
    assert queued_ids(client, turn.turn_id) == [str(turn.turn_id)]


def test_a_turn_behind_a_running_one_is_left_to_its_predecessor(zero_grace: redis.Redis) -> None:
    client = zero_grace
    session_id = create_session(framework="none", model="echo")
    first = submit_turn(session_id, "first")
    second = submit_turn(session_id, "second")
    client.flushdb()
    with session_scope() as db:
        db.execute(
            update(Turn)
            .where(Turn.id == first.turn_id)
            .values(
                status=TurnStatus.RUNNING, lease_token=uuid.uuid4(), lease_expires_at=func.now() + timedelta(minutes=5)
            )
        )
    sweep_once(build_runtime())
    assert str(second.turn_id) not in queued_ids(client)

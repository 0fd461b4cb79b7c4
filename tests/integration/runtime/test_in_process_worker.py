"""The test harness that runs queued turns in this process (tests/support/inprocess.py) does what a worker does
with what it takes: waits out a message's countdown, and refuses what the worker's intake refuses."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import redis

from tests.support.broker import wait_until
from tests.support.inprocess import InProcessWorker
from tests.support.turns import wait_for_turn
from worker.dispatch import send_turn
from worker.events import get_redis
from worker.markers import sent_marker
from worker.producer import create_session


def test_a_message_sent_with_a_countdown_runs_after_it_and_its_marker_is_dropped(
    in_process: InProcessWorker, redis_url: str
) -> None:
    session_id = create_session(framework="none", model="echo")
    turn_id = uuid.uuid4()
    message = {"turn_id": str(turn_id), "session_id": str(session_id), "content": "later", "images": None}
    sent = datetime.now(UTC)
    assert send_turn(message, queue="chatq", countdown=1.5, client=get_redis())
    row = wait_for_turn(turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.started_at is not None and row.started_at >= sent + timedelta(seconds=1.4)
    in_process.wait_idle()  # the task records its outcome after the turn's row is committed
    assert in_process.outcomes(turn_id) == ["succeeded"]
    client = redis.Redis.from_url(redis_url)
    try:
        assert not client.exists(sent_marker(turn_id)), "taken messages drop their sent-marker, as on a worker"
    finally:
        client.close()


def test_an_item_the_workers_intake_refuses_is_reported_not_run(chatq_env: dict[str, str], redis_url: str) -> None:
    runner = InProcessWorker(redis_url, threads=1).start()
    client = redis.Redis.from_url(redis_url)
    try:
        client.lpush("chatq", b"\x00 not json")
        wait_until("the item is refused", lambda: bool(runner.errors), timeout=10)
    finally:
        client.close()
        runner.stop()
    assert runner.errors == ["refused an item of chatq: the item is not JSON (Expecting value at character 0)"]
    assert runner.results == {}

"""A worker killed after it took a turn's message but before running it: the sweeper re-sends the turn."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from tests.faults.helpers import (
    REQUEUE_GRACE,
    STUB_MODEL,
    SWEEP_INTERVAL,
    Beat,
    Workers,
    load_turns,
    wait_finished,
    wait_for_event,
)
from tests.support.poison import died_marker
from tests.support.turns import turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_a_message_taken_by_a_worker_that_died_before_starting_it_is_resent_after_the_grace(
    workers: Workers, beat: Beat, redis_url: str
) -> None:
    """README: CHATQ_REQUEUE_GRACE is how long a runnable queued turn may wait before it is re-sent.

    A worker killed after it took a turn's message off the queue but before the task body started
    leaves the message in its `unacked` set, where Redis returns it only after the visibility
    timeout (an hour). The turn is still `queued`, so the sweeper is the only way it runs again, and
    it should re-send it after the grace, as it does for any other lost message.
    """
    key = uuid.uuid4().hex
    plugin = {"CHATQ_PLUGINS": "tests.support.poison"}
    try:
        doomed = workers.one(env=plugin)
        session_id = create_session(framework="langgraph", model=STUB_MODEL)
        turn = submit_turn(session_id, f"hello [die-before-start: {key}] [words: 3]")
        deadline = time.monotonic() + 30
        while doomed.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        died_at = time.time()
        assert not doomed.alive, "the worker should have died on taking the message"
        row = load_turns([turn.turn_id])[turn.turn_id]
        assert row.status.value == "queued" and row.deliveries == 0

        client = redis.Redis.from_url(redis_url)
        try:  # what the sweeper will believe (evidence for the failure message only)
            marker_left = bool(client.exists(f"chatq:sent:{turn.turn_id}"))
        finally:
            client.close()
        launched = time.monotonic()
        workers.one(env=plugin)  # a healthy worker: the death for this key has happened
        start_cost = time.monotonic() - launched  # a loaded machine starts a worker slowly: not the sweeper's time
        started = wait_for_event(redis_url, turn.turn_id, "started", timeout=90)
        waited = float(started["ts"]) - died_at
        print(f"\nturn whose message died with its worker started {waited:.1f}s later (grace {REQUEUE_GRACE:g}s)")
        row = wait_finished([turn.turn_id], timeout=30)[turn.turn_id]
        assert row.status.value == "succeeded", row.error
        assert [m.role for m in turn_messages(turn.turn_id)] == ["user", "assistant"]
        bound = REQUEUE_GRACE + SWEEP_INTERVAL + start_cost + 5  # + the turn's own start
        assert waited < bound, (
            f"the lost message was re-sent only after {waited:.0f}s, not within CHATQ_REQUEUE_GRACE "
            f"({REQUEUE_GRACE:g}s) + a sweep (sent-marker left behind by the dead worker: {marker_left})"
        )
    finally:
        died_marker(key).unlink(missing_ok=True)

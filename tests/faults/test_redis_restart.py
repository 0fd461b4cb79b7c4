"""Redis restarting (it keeps nothing on disk) while turns are queued and running: each completes once."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from tests.faults.helpers import (
    STUB_MODEL,
    Beat,
    RedisControl,
    Workers,
    messages_by_turn,
    session_transcript,
    wait_finished,
    wait_status,
)
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

SESSIONS, TURNS = 3, 10
TEXT = "[slow: 0.05] [words: 20]"


def _wait_for_queue_bindings(redis_url: str, timeout: float) -> float:
    """Seconds until a consumer has declared the `chatq` queue again (messages can be routed)."""
    started = time.monotonic()
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=1)
    try:
        while time.monotonic() - started < timeout:
            try:
                if client.smembers("_kombu.binding.chatq"):
                    return time.monotonic() - started
            except redis.RedisError:
                pass
            time.sleep(0.1)
    finally:
        client.close()
    raise AssertionError(f"no worker declared the chatq queue again within {timeout:.0f}s of the restart")


@pytest.mark.timeout(150)
def test_turns_queued_and_running_across_a_redis_restart_all_succeed_once(
    redis_server: RedisControl, workers: Workers, beat: Beat, redis_url: str
) -> None:
    worker = workers.one(concurrency=8)
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(SESSIONS)]
    submitted: list[tuple[uuid.UUID, uuid.UUID, str]] = []
    for index in range(TURNS):
        session_id = sessions[index % SESSIONS]
        content = f"turn {index} {TEXT}"
        submitted.append((submit_turn(session_id, content).turn_id, session_id, content))
    turn_ids = [turn_id for turn_id, _, _ in submitted]
    wait_status(turn_ids[0], "running", timeout=30)
    time.sleep(0.3)  # mid-stream, later turns of each session still queued

    outage = redis_server.restart()
    restarted_at = time.monotonic()
    print(f"\nRedis restarted (shutdown nosave + start) in {outage:.2f}s")
    rebound = _wait_for_queue_bindings(redis_url, timeout=60)
    print(f"the worker declared its queues again {rebound:.1f}s after the restart")

    rows = wait_finished(turn_ids, timeout=100)
    print(f"all {len(turn_ids)} turns finished {time.monotonic() - restarted_at:.1f}s after the restart")
    assert {str(k)[:8]: (r.status.value, r.error) for k, r in rows.items() if r.status.value != "succeeded"} == {}
    by_turn = messages_by_turn(sessions)
    assert {t: [m.role for m in by_turn.get(t, [])] for t in turn_ids} == {t: ["user", "assistant"] for t in turn_ids}
    for session_id in sessions:
        transcript = session_transcript(session_id)
        expected = [content for _, sid, content in submitted if sid == session_id]
        assert [content for role, content in transcript if role == "user"] == expected
        assert [role for role, _ in transcript] == ["user", "assistant"] * len(expected)

    assert worker.alive, worker.log()[-3000:]
    assert beat.alive, "beat should survive a Redis restart by itself"
    after = submit_turn(sessions[0], "still there after the restart? [words: 3]")
    row = wait_finished([after.turn_id], timeout=30)[after.turn_id]
    assert row.status.value == "succeeded", row.error
    assert worker.alive and beat.alive

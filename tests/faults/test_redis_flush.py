"""Every queued message lost (FLUSHDB of the test's Redis db) while no worker runs: the sweeper re-sends them."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from tests.faults.helpers import (
    REQUEUE_GRACE,
    STUB_MODEL,
    Beat,
    Workers,
    assert_each_turn_answered_once,
    wait_finished,
)
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

SESSIONS, TURNS_PER_SESSION = 3, 3


@pytest.mark.timeout(120)
def test_turns_whose_messages_were_flushed_from_redis_all_run_once(
    workers: Workers, beat_process: Beat, redis_url: str
) -> None:
    assert not workers.alive
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(SESSIONS)]
    texts: dict[uuid.UUID, list[str]] = {s: [] for s in sessions}
    turn_ids: list[uuid.UUID] = []
    for index in range(TURNS_PER_SESSION):
        for number, session_id in enumerate(sessions):
            text = f"session {number} turn {index} [words: 4]"
            turn_ids.append(submit_turn(session_id, text).turn_id)
            texts[session_id].append(text)

    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen("chatq") == len(turn_ids)
        client.flushdb()
        assert client.llen("chatq") == 0
    finally:
        client.close()

    flushed_at = time.monotonic()
    workers.one()
    beat_process.start()
    rows = wait_finished(turn_ids, timeout=90)
    recovery = time.monotonic() - flushed_at
    print(f"\n{len(turn_ids)} flushed turns all finished {recovery:.1f}s after the flush (grace {REQUEUE_GRACE:g}s)")

    assert_each_turn_answered_once(rows, texts)
    assert all(row.attempts == 1 for row in rows.values())
    assert workers.alive

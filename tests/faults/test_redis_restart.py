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
    assert_each_turn_answered_once,
    load_turns,
    wait_finished,
    wait_status,
)
from tests.support.turns import FINISHED
from worker.producer import create_session, submit_turn

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

SESSIONS, TURNS = 6, 14
TEXT = "[slow: 0.05] [words: 20]"


def _wait_for_queue_bindings(redis_url: str, timeout: float) -> float | None:
    """Seconds until someone declared the `chatq` queue again (messages can be routed), None if not yet."""
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
    return None


@pytest.mark.timeout(150)
def test_turns_queued_and_running_across_a_redis_restart_all_succeed_once(
    redis_server: RedisControl, workers: Workers, beat: Beat, redis_url: str
) -> None:
    # Two workers, each with turns in hand when Redis goes away.
    originals = workers.start(2, concurrency=4)
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(SESSIONS)]
    submitted: list[tuple[uuid.UUID, uuid.UUID, str]] = []
    for index in range(TURNS):
        session_id = sessions[index % SESSIONS]
        content = f"turn {index} {TEXT}"
        submitted.append((submit_turn(session_id, content).turn_id, session_id, content))
    turn_ids = [turn_id for turn_id, _, _ in submitted]
    for turn_id in turn_ids[:SESSIONS]:
        wait_status(turn_id, "running", timeout=30)
    time.sleep(0.3)  # mid-stream, later turns of each session still queued

    outage = redis_server.restart()
    restarted_at = time.monotonic()
    print(f"\nRedis restarted (shutdown nosave + start) in {outage:.2f}s")
    rebound = _wait_for_queue_bindings(redis_url, timeout=15)
    declared = f"{rebound:.1f}s" if rebound is not None else "not within 15s"
    print(f"the chatq queue was declared again {declared} after the restart (sends before that are not routed)")

    # Acting as a supervisor would: a worker that died is replaced, so the turn guarantees (none
    # lost, none duplicated) are checked either way; the workers' own survival is asserted last.
    replaced: list[str] = []
    deadline = time.monotonic() + 100
    while True:
        rows = load_turns(turn_ids)
        if all(row.status.value in FINISHED for row in rows.values()):
            break
        assert time.monotonic() < deadline, {str(k)[:8]: r.status.value for k, r in rows.items()}
        for worker in originals:
            if not worker.alive and worker.name not in replaced:
                code = worker.process.returncode if worker.process else None
                print(f"worker {worker.name} exited (code {code}) after the restart; starting a replacement")
                replaced.append(worker.name)
                workers.one(concurrency=4)
        time.sleep(0.2)
    print(f"all {len(turn_ids)} turns finished {time.monotonic() - restarted_at:.1f}s after the restart")
    assert_each_turn_answered_once(rows, {s: [c for _, sid, c in submitted if sid == s] for s in sessions})

    assert beat.alive, "beat should survive a Redis restart by itself"
    after = submit_turn(sessions[0], "still there after the restart? [words: 3]")
    row = wait_finished([after.turn_id], timeout=30)[after.turn_id]
    assert row.status.value == "succeeded", row.error
    assert beat.alive

    crashes = {
        worker.name: next((line for line in worker.log().splitlines() if "Unrecoverable error" in line), "")[:300]
        for worker in originals
        if not worker.alive
    }
    assert not replaced and all(worker.alive for worker in originals), (
        f"{len(crashes)} of {len(originals)} workers did not survive the Redis restart: {crashes}"
    )

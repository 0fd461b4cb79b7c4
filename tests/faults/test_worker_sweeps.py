"""Recovery with only workers running, no `chatq beat` anywhere: each worker sweeps by itself.

A turn stored while Redis was unreachable (never sent) and a turn whose worker was killed with
SIGKILL mid-stream both finish exactly once, with two workers sweeping on their own timers
(CHATQ_SWEEP_INTERVAL 1 s, lease 3 s, grace 3 s: tests/support/workers.py's TEST_ENV, with
CHATQ_WORKER_SWEEP back on).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tests.faults.helpers import (
    LEASE_SECONDS,
    REQUEUE_GRACE,
    STUB_MODEL,
    SWEEP_INTERVAL,
    Workers,
    load_turns,
    wait_finished,
    wait_for_event,
)
from tests.support.cli import chatq
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"
"""Nothing listens on port 1: a producer using it stores its turn but cannot send it."""


@pytest.fixture(scope="module")
def sweeping(worker_env: dict[str, str]) -> Iterator[Workers]:
    """Workers that sweep by themselves, as every `chatq worker` does by default (the suite's
    other workers do not: tests/support/workers.py's TEST_ENV); killed after the module."""
    pool = Workers({**worker_env, "CHATQ_WORKER_SWEEP": "on"})
    try:
        yield pool
    finally:
        pool.kill_all()


@pytest.fixture
def workers(sweeping: Workers) -> Iterator[Workers]:
    """Two live sweeping workers for each test: the module's pair (a start-up costs seconds of
    CPU), topped up when a test before killed one."""
    sweeping.top_up(2)
    yield sweeping
    print(sweeping.logs())  # shown only when the test failed


def _deliveries(workers: Workers, turn_id: uuid.UUID) -> int:
    """Task messages of the turn that workers received (Celery logs each one at INFO)."""
    return sum(worker.log().count(f"[{turn_id}] received") for worker in workers.started)


@pytest.mark.timeout(120)
def test_a_turn_submitted_while_redis_was_down_runs_once_with_only_workers(
    workers: Workers, worker_env: dict[str, str], redis_url: str
) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    submitted = chatq(
        {**worker_env, "REDIS_URL": UNREACHABLE_REDIS}, "submit", str(session_id), "hello [words: 3]", timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    assert "could not send" in submitted.stderr
    turn_id = uuid.UUID(submitted.stdout.strip())
    stored_at = time.monotonic()
    # Stored, not failed; on a loaded machine the CLI itself can take longer than the grace, so a
    # worker's sweep may already have sent it.
    assert load_turns([turn_id])[turn_id].status.value in ("queued", "running", "succeeded")

    row = wait_finished([turn_id], timeout=REQUEUE_GRACE + 60)[turn_id]
    print(f"\nturn never sent ran {time.monotonic() - stored_at:.1f}s after it was stored (grace {REQUEUE_GRACE:g}s)")
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1
    assert [m.role for m in turn_messages(turn_id)] == ["user", "assistant"]
    types = [event["type"] for event in replay_events(redis_url, turn_id)]
    assert types.count("started") == 1 and types.count("final") == 1 and types[-1] == "final"
    # Two workers sweep every second; one sweep at a time sends the turn once, and no second message follows.
    assert _deliveries(workers, turn_id) == 1
    assert len(workers.alive) == 2


@pytest.mark.timeout(120)
def test_a_sigkilled_workers_turn_is_taken_over_once_with_only_workers(workers: Workers, redis_url: str) -> None:
    first, second = workers.alive
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, "tell me a long story [words: 40] [slow: 0.1]")
    wait_for_event(redis_url, turn.turn_id, "text", count=5, timeout=30)
    victim = workers.owner_of(turn.turn_id)
    survivor = second if victim is first else first
    killed_at = time.time()
    victim.kill()

    restarted = wait_for_event(redis_url, turn.turn_id, "started", count=2, timeout=LEASE_SECONDS * 4 + 30)
    print(
        f"\ntakeover after kill -9 without beat: {float(restarted['ts']) - killed_at:.2f}s "
        f"(lease {LEASE_SECONDS:g}s, sweep every {SWEEP_INTERVAL:g}s)"
    )
    row = wait_finished([turn.turn_id], timeout=60)[turn.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(survivor.hostname_prefix)
    assert row.attempts == 2
    # The survivor's own sweep took the turn back (nothing else sweeps here).
    assert f"turn {turn.turn_id}: lease expired, handed to another worker" in survivor.log()

    stored = turn_messages(turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content.split() == [f"w{i}" for i in range(1, 41)]
    events = replay_events(redis_url, turn.turn_id)
    types = [event["type"] for event in events]
    assert types.count("final") == 1 and types[-1] == "final"
    assert events[-1]["messages"][-1]["content"] == stored[1].content
    assert survivor.alive

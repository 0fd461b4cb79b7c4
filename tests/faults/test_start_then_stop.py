"""Workers stopped within seconds of their start, again and again, one turn queued: the turn still
runs within the sweep's grace once a worker stays (issue 34: it waited for the visibility timeout).

Each stopped worker may take the turn's message, hand it back, or take it and stop before Celery
receives it (then it sits in kombu's `unacked` hash with its sent-marker set); whatever happened,
the staying worker's sweep sends the turn again after CHATQ_REQUEUE_GRACE at the latest.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.faults.helpers import REQUEUE_GRACE, STUB_MODEL, SWEEP_INTERVAL, Workers, load_turns, wait_finished
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

# 3 in `make test` (each start costs a worker start-up); CHATQ_START_STOP_CYCLES=30 for a long look.
CYCLES = int(os.environ.get("CHATQ_START_STOP_CYCLES", "3"))


@pytest.mark.timeout(120 + CYCLES * 30)
def test_a_turn_left_by_workers_stopped_at_their_start_runs_within_the_grace(workers: Workers) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, "hello [words: 40] [slow: 0.1]")  # longer than any brief life
    rng = random.Random(34)
    for cycle in range(CYCLES):
        if load_turns([turn.turn_id])[turn.turn_id].status.value == "succeeded":
            break  # a stopped worker ran it to the end before its stop: nothing left to lose
        worker = workers.launch(name=f"brief{cycle}-{os.getpid()}")
        time.sleep(rng.uniform(1.0, 4.0))
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGINT if cycle % 2 else signal.SIGTERM)
        worker.process.wait(60)  # any status: a Ctrl-C during its imports aborts it (click's "Aborted!")
    stopped_at = time.monotonic()
    workers.one(env={"CHATQ_WORKER_SWEEP": "on"})
    row = wait_finished([turn.turn_id], timeout=60)[turn.turn_id]
    waited = time.monotonic() - stopped_at
    print(f"\nturn done {waited:.1f}s after the last stop (grace {REQUEUE_GRACE:g}s, sweep every {SWEEP_INTERVAL:g}s)")
    assert row.status.value == "succeeded", row.error
    # A worker's start (a few seconds here), then at most the grace and a sweep interval, not an hour.
    assert waited < 45

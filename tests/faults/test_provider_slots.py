"""A worker killed while it holds a slot of a model's shared limits: the slot comes back by itself."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.faults.helpers import Workers, wait_finished, wait_status
from tests.support.turns import replay_events
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def test_a_killed_workers_slots_come_back(workers: Workers, redis_url: str) -> None:
    model = f"solo-{uuid.uuid4().hex[:8]}"
    # One request in flight at a time for this model; a slot lapses 10 s after the turn timeout.
    env = {"CHATQ_MODEL_LIMITS": json.dumps({model: {"max_concurrent": 1}}), "CHATQ_TURN_TIMEOUT": "3"}
    doomed = workers.one(env=env)
    stuck = submit_turn(create_session(framework="none", model=model), "a long one [sleep: 60]")
    wait_status(stuck.turn_id, "running", timeout=30)
    doomed.kill()
    workers.one(env=env)
    waiting = submit_turn(create_session(framework="none", model=model), "the next one")
    row = wait_finished([waiting.turn_id], timeout=90)[waiting.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1
    reasons = [e["waiting"]["reason"] for e in replay_events(redis_url, waiting.turn_id) if e.get("waiting")]
    assert reasons and set(reasons) == {"concurrency"}, "it waited for the dead worker's slot, then got it"

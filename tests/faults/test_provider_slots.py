"""A worker killed while it holds a slot of a model's shared limits: the slot comes back by itself."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.faults.helpers import Worker, Workers, wait_finished, wait_for_event
from tests.support.turns import replay_events
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def test_a_killed_workers_slots_come_back(workers: Workers, redis_url: str) -> None:
    model = f"solo-{uuid.uuid4().hex[:8]}"
    # One request in flight at a time for this model; a slot lapses 10 s after the turn timeout.
    env = {**workers.env, "CHATQ_MODEL_LIMITS": json.dumps({model: {"max_concurrent": 1}}), "CHATQ_TURN_TIMEOUT": "3"}
    # Both up before anything runs (a slow start must not eat the slot's lease), each on its own
    # queue, so the turn to strand surely runs on the worker that is killed.
    doomed = Worker(env, queues="chatq", name=f"doomed-{uuid.uuid4().hex[:6]}")
    survivor = Worker(env, queues="chatq.batch", name=f"survivor-{uuid.uuid4().hex[:6]}")
    workers.started += [doomed, survivor]
    for worker in (doomed.launch(), survivor.launch()):
        worker.wait_ready()
    stuck = submit_turn(create_session(framework="none", model=model), "a long one [sleep: 60]")
    wait_for_event(redis_url, stuck.turn_id, "started")  # published once the turn holds its slot
    doomed.kill()
    waiting = submit_turn(create_session(framework="none", model=model), "the next one", queue="chatq.batch")
    row = wait_finished([waiting.turn_id], timeout=90)[waiting.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1
    reasons = [e["waiting"]["reason"] for e in replay_events(redis_url, waiting.turn_id) if e.get("waiting")]
    assert reasons and set(reasons) == {"concurrency"}, "it waited for the dead worker's slot, then got it"

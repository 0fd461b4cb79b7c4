"""A real `chatq worker` joins the fleet's threads and counts a tenant's batch turns until it takes them
(worker.runtime.policy.threads, worker.tenant_queue): its due timer and its `task_received` handler
are what only a real worker runs."""

from __future__ import annotations

import uuid

import pytest

from tests.support.broker import wait_until
from tests.support.turns import wait_for_turns
from tests.support.workers import WorkerProcess
from worker import tenant_queue
from worker.events import get_redis
from worker.producer import create_session, submit_turn
from worker.runtime.policy import limits, threads

pytestmark = pytest.mark.slow


def test_a_worker_registers_its_threads_and_uncounts_each_batch_turn_it_takes(worker: WorkerProcess) -> None:
    client = get_redis()
    wait_until("the worker's threads are in the fleet's", lambda: threads.read_fleet(client) > 0, timeout=15)
    # Other packages' tests drop the messages they leave queued without a worker taking them: their
    # counts are phantoms a lone tenant would yield to until the list moved past them.
    client.delete(tenant_queue.QUEUED_KEY)
    tenant = f"solo-{uuid.uuid4().hex[:8]}"
    sessions = [create_session(framework="none", model="echo", tenant=tenant) for _ in range(20)]
    turn_ids = [submit_turn(session, "hi", queue="chatq.batch").turn_id for session in sessions]
    rows = wait_for_turns(turn_ids, timeout=60)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    # Every message was counted for its tenant when sent and uncounted when the worker took it.
    assert tenant not in tenant_queue.waiting(client)
    assert client.hget(tenant_queue.QUEUED_KEY, f"c:{tenant}") == b"0"
    assert int(client.hget(tenant_queue.QUEUED_KEY, "G") or 0) >= 20
    # Each ran under the threads' share (one tenant alone: never held back).
    share = {s.tenant: s for s in limits.shares(client, threads.threads_scope(1))}[tenant]
    assert share.granted >= 20 and share.yielded == 0

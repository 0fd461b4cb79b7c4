"""Each tenant's batch turn messages waiting in `chatq.batch` (worker.tenant_queue), counted on the
sent-markers as chatq's senders set them and as workers take the messages, against the real Redis."""

from __future__ import annotations

import pytest
import redis

from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.turns import wait_for_turns
from worker import tenant_queue
from worker.events import get_redis
from worker.markers import mark_taken, sent_marker, set_markers
from worker.payload import BATCH_QUEUE
from worker.producer import create_session, submit_turn
from worker.runtime.recovery.sweeper import forget_idle_tenants


@pytest.fixture
def client(chatq_env: dict[str, str]) -> redis.Redis:
    redis_client = get_redis()
    redis_client.delete(tenant_queue.QUEUED_KEY)
    return redis_client


def test_a_counted_marker_set_again_counts_once_and_an_unsent_one_is_uncounted(client: redis.Redis) -> None:
    set_markers(client, ["t1", "t2"], {"t1": "acme", "t2": "acme"})
    set_markers(client, ["t1"], {"t1": "acme"})  # a sweep's re-send of a message still waiting
    assert tenant_queue.waiting(client) == {"acme": 2}
    assert client.get(sent_marker("t1")) == b"t:acme"
    tenant_queue.drop_unsent(client, [sent_marker("t2")])
    mark_taken(client, "t1", queue=BATCH_QUEUE)
    mark_taken(client, "t1", queue=BATCH_QUEUE)  # a duplicate copy taken later uncounts nothing
    assert tenant_queue.waiting(client) == {}
    assert not client.exists(sent_marker("t1"))
    assert client.hget(tenant_queue.QUEUED_KEY, "G") == b"2"  # every take off the list is counted


def test_the_producer_counts_a_tenants_batch_turns_by_its_sessions_tenant_only(client: redis.Redis) -> None:
    acme = create_session(framework="none", model="echo", tenant="acme")
    plain = create_session(framework="none", model="echo")
    submit_turn(acme, "one", queue=BATCH_QUEUE)  # no tenant= given: the session's, read by the insert
    submit_turn(acme, "two", queue=BATCH_QUEUE, tenant="acme")
    submit_turn(plain, "no tenant", queue=BATCH_QUEUE)
    submit_turn(acme, "interactive")
    assert tenant_queue.waiting(client) == {"acme": 2}


def test_a_worker_taking_the_turns_uncounts_them(client: redis.Redis, in_process: InProcessWorker) -> None:
    sessions = [create_session(framework="none", model="echo", tenant="acme") for _ in range(5)]
    turns = [submit_turn(session, "hi", queue=BATCH_QUEUE).turn_id for session in sessions]
    rows = wait_for_turns(turns)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    assert tenant_queue.waiting(client) == {}


def test_the_sweep_drops_the_counts_of_tenants_with_no_batch_turn_queued(client: redis.Redis) -> None:
    busy = create_session(framework="none", model="echo", tenant="busy")
    submit_turn(busy, "waits", queue=BATCH_QUEUE)  # queued in Postgres: its count stands
    set_markers(client, ["g1", "g2"], {"g1": "gone", "g2": "gone"})  # their sessions were deleted since
    set_markers(client, ["f1"], {"f1": "fresh"})  # just sent: its turn may not be visible yet
    client.hset(tenant_queue.QUEUED_KEY, mapping={"t:busy": 0, "t:gone": 0})  # quiet for long
    assert forget_idle_tenants(build_runtime()) == 1
    assert tenant_queue.waiting(client) == {"busy": 1, "fresh": 1}

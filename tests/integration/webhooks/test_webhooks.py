"""Webhooks end to end: the runtime POSTs ended turns to real local receivers, signed, retried, never followed.

The runtime allows private addresses (the receivers listen on 127.0.0.1), retries after 0.2 s
doubling for 3 s, and sends one delivery at a time per process, with a long attempt timeout so a
held request stays held while turns run. The turns and deliveries run in this process
(`in_process`); the last test is the real-worker case of webhooks (a worker's guarded queue).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.integration.webhooks.conftest import SECRET, STUB_MODEL
from tests.support.envelopes import encoded, envelope
from tests.support.inprocess import InProcessWorker
from tests.support.receiver import Received, Receiver
from tests.support.turns import wait_for_status, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.payload import WEBHOOK_QUEUE
from worker.producer import cancel_turn, create_session, submit_turn
from worker.queries import turn_report
from worker.runtime.intake.deadletter import DEAD_LETTER_KEY

WORKER_ENV = {
    "CHATQ_WEBHOOK_SECRET": SECRET,
    "CHATQ_WEBHOOK_ALLOW_PRIVATE": "1",
    "CHATQ_WEBHOOK_BACKOFF": "0.2",
    "CHATQ_WEBHOOK_RETRY_FOR": "3",
    "CHATQ_WEBHOOK_TIMEOUT": "30",
    "CHATQ_WEBHOOK_CONCURRENCY": "1",
}


@pytest.fixture
def in_process_env() -> dict[str, str]:
    return WORKER_ENV


@pytest.fixture(scope="module")
def worker(worker_env: dict[str, str]) -> Iterator[WorkerProcess]:
    process = WorkerProcess({**worker_env, **WORKER_ENV}, concurrency=4).start()
    yield process
    process.stop()


def _verify(received: Received) -> None:
    """What a receiver does: recompute the signature over the timestamp, the delivery id and the raw body."""
    timestamp, delivery = received.headers["x-chatq-timestamp"], received.headers["x-chatq-delivery"]
    signed = f"{timestamp}.{delivery}.".encode() + received.body
    expected = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(received.headers["x-chatq-signature"], f"sha256={expected}")


def _delivery(turn_id: uuid.UUID, status: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """The turn's webhook entry once its delivery has `status`."""
    deadline = time.monotonic() + timeout
    while True:
        webhook = turn_report(turn_id)["webhook"]
        if webhook is not None and webhook["status"] == status:
            return dict(webhook)
        assert time.monotonic() < deadline, f"delivery of {turn_id} not {status}: {webhook}"
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_every_ended_turn_is_posted_signed_as_get_turns_returns_it(
    in_process: InProcessWorker, receiver: Receiver, allow_private: None
) -> None:
    session_url = receiver.answer("/session")
    turn_url = receiver.answer("/turn")
    session_id = create_session(framework="langgraph", model=STUB_MODEL, webhook=session_url)
    slow = submit_turn(session_id, "take your time [words: 10] [slow: 0.2]")
    queued = submit_turn(session_id, "never mind")
    wait_for_status(slow.turn_id, "running")
    assert cancel_turn(queued.turn_id).status.value == "cancelled"
    failing = submit_turn(session_id, "this breaks [fail]")
    own = submit_turn(session_id, "to my own hook [words: 2]", webhook=turn_url)
    wait_for_turns([slow.turn_id, failing.turn_id, own.turn_id])

    by_turn = {json.loads(r.body)["id"]: r for r in receiver.wait_for(3, "/session")}
    assert set(by_turn) == {str(slow.turn_id), str(queued.turn_id), str(failing.turn_id)}
    (mine,) = receiver.wait_for(1, "/turn")
    assert json.loads(mine.body)["id"] == str(own.turn_id)  # the turn's webhook instead of the session's
    events = {}
    for turn_id, received in [*by_turn.items(), (str(own.turn_id), mine)]:
        _verify(received)
        report = turn_report(turn_id)
        webhook = _delivery(uuid.UUID(turn_id), "delivered")
        assert received.headers["x-chatq-delivery"] == webhook["delivery_id"]
        assert received.headers["content-type"] == "application/json"
        assert received.headers["x-chatq-attempt"] == "1"
        body = json.loads(received.body)
        assert body == {key: value for key, value in report.items() if key != "webhook"}
        events[turn_id] = received.headers["x-chatq-event"]
        assert webhook["attempts"] == 1 and webhook["last_status_code"] == 200 and webhook["last_error"] is None
    assert events == {
        str(slow.turn_id): "turn.succeeded",
        str(queued.turn_id): "turn.cancelled",
        str(failing.turn_id): "turn.failed",
        str(own.turn_id): "turn.succeeded",
    }
    assert json.loads(by_turn[str(slow.turn_id)].body)["messages"][-1]["role"] == "assistant"


@pytest.mark.timeout(60)
def test_a_500_is_retried_with_the_same_delivery_id_and_body(
    in_process: InProcessWorker, receiver: Receiver, allow_private: None
) -> None:
    url = receiver.answer("/flaky", 500, 200)
    session_id = create_session(framework="langgraph", model=STUB_MODEL, webhook=url)
    turn = submit_turn(session_id, "hello [words: 3]")
    first, second = receiver.wait_for(2, "/flaky")
    webhook = _delivery(turn.turn_id, "delivered")

    assert first.headers["x-chatq-delivery"] == second.headers["x-chatq-delivery"] == webhook["delivery_id"]
    assert first.body == second.body
    assert (first.headers["x-chatq-attempt"], second.headers["x-chatq-attempt"]) == ("1", "2")
    _verify(first)
    _verify(second)
    assert webhook["attempts"] == 2 and webhook["last_status_code"] == 200 and webhook["last_error"] is None


@pytest.mark.timeout(60)
def test_a_redirect_is_not_followed_to_another_host(
    in_process: InProcessWorker, receiver: Receiver, allow_private: None
) -> None:
    with Receiver() as elsewhere:
        landing = elsewhere.answer("/landing")
        url = receiver.answer("/moved", 307, location=landing)
        session_id = create_session(framework="langgraph", model=STUB_MODEL, webhook=url)
        turn = submit_turn(session_id, "hello [words: 3]")
        # Retried (a 3xx is not a delivery) until the 3 s window is over, then given up.
        webhook = _delivery(turn.turn_id, "failed")
        assert len(receiver.received("/moved")) == webhook["attempts"] >= 2
        assert webhook["last_status_code"] == 307 and "not followed" in webhook["last_error"]
        assert elsewhere.received() == []


@pytest.mark.timeout(90)
def test_a_receiver_that_does_not_answer_holds_no_turn_and_at_most_one_thread(
    in_process: InProcessWorker, receiver: Receiver, allow_private: None
) -> None:
    url = receiver.answer("/slow", hold=True)
    hooked = create_session(framework="langgraph", model=STUB_MODEL, webhook=url)
    first = [submit_turn(hooked, f"notify me {i} [words: 2]") for i in range(3)]
    wait_for_turns([t.turn_id for t in first])
    receiver.wait_until(lambda: receiver.holding == 1, what="a held request")

    # While the receiver holds a delivery (and two more wait for the process's one delivery
    # slot), turns of other sessions run on the worker's other threads as usual.
    others = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(6)]
    later = [submit_turn(session_id, "meanwhile [words: 3]") for session_id in others]
    rows = wait_for_turns([t.turn_id for t in later], timeout=30)
    assert all(row.status.value == "succeeded" for row in rows.values())
    assert receiver.holding == 1 and receiver.max_holding == 1
    assert [turn_report(t.turn_id)["webhook"]["status"] for t in first] == ["pending"] * 3

    receiver.release()
    for turn in first:
        _delivery(turn.turn_id, "delivered")
    assert len(receiver.received("/slow")) == 3
    assert wait_for_turn(first[0].turn_id).status.value == "succeeded"


# The real-worker case of webhooks: deliveries taken from a worker's guarded queue.
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_malformed_items_on_the_webhook_queue_are_set_aside_and_deliveries_go_on(
    worker: WorkerProcess, receiver: Receiver, allow_private: None, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)

    def set_aside() -> list[dict[str, Any]]:
        entries = [json.loads(raw) for raw in client.lrange(DEAD_LETTER_KEY, 0, -1)]
        return [entry for entry in entries if entry["queue"] == WEBHOOK_QUEUE]

    before = len(set_aside())
    delivery = str(uuid.uuid4())
    task = {"task": "chatq.deliver_webhook"}
    # Celery's two-element body (the crash-loop shape), a canvas, and bytes that are not JSON.
    client.lpush(WEBHOOK_QUEUE, encoded(envelope(body=[[], {"delivery_id": delivery}], task_id=delivery, headers=task)))
    client.lpush(WEBHOOK_QUEUE, encoded(envelope(body=[[], {}, {"chain": "x"}], headers=task)))
    client.lpush(WEBHOOK_QUEUE, b"\x00 not json")
    # Well formed, but not what the task takes: refused by the task, nothing changes.
    client.lpush(WEBHOOK_QUEUE, encoded(envelope({"delivery_id": "not-a-uuid"}, headers=task)))
    deadline = time.monotonic() + 30
    while len(set_aside()) < before + 3:
        assert time.monotonic() < deadline, "the malformed items were not set aside"
        time.sleep(0.1)
    assert worker.alive
    url = receiver.answer("/after")
    turn = submit_turn(create_session(framework="langgraph", model=STUB_MODEL, webhook=url), "still here [words: 2]")
    _delivery(turn.turn_id, "delivered")
    assert "rejected: delivery_id" in worker.log()
    client.close()

"""A delivery whose task message was never sent (the process died right after the commit that
recorded it) or was lost is sent by the sweep, once; a copy of a message attempts nothing.

A process killed between the commit and the send is played by the seam that sends (replaced by a
no-op): the commit happened, the message never left. "Due for a minute" is set on the row rather
than waited for.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import select, text, update

from models.db import session_scope
from models.tables import DeliveryEvent, DeliveryStatus, WebhookDelivery
from tests.integration.webhooks.conftest import STUB_MODEL
from tests.support.env import environ
from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.receiver import Receiver
from tests.support.turns import wait_for_turn
from worker.dispatch import send_delivery
from worker.producer import cancel_turn, create_session, submit_turn
from worker.queries import turn_report
from worker.runtime.recovery.sweeper import sweep_once
from worker.runtime.webhooks.deliveries import DeliveryOutcome, deliver
from worker.runtime.webhooks.recovery import take_lost_deliveries

GRACE = "5"
"""CHATQ_REQUEUE_GRACE here: a row due for a minute is lost, one made due by a sweep just now is not."""


def _lose(*_: object, **__: object) -> None:
    """The send after the commit, in a process killed right after that commit."""


def _rows(turn_id: uuid.UUID) -> list[WebhookDelivery]:
    with session_scope() as db:
        query = select(WebhookDelivery).where(WebhookDelivery.turn_id == turn_id).order_by(WebhookDelivery.ordinal)
        rows = list(db.execute(query).scalars())
        db.expunge_all()
        return rows


def _due_for_a_minute(delivery_id: uuid.UUID) -> None:
    with session_scope() as db:
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(next_attempt_at=text("now() - interval '60 seconds'"))
        )


@pytest.fixture
def in_process_env() -> dict[str, str]:
    return {"CHATQ_WEBHOOK_ALLOW_PRIVATE": "1", "CHATQ_REQUEUE_GRACE": GRACE}


@pytest.fixture
def settings_here(allow_private: None) -> Iterator[None]:
    """This process's settings as the workers': private receivers allowed, the grace above."""
    with environ(CHATQ_REQUEUE_GRACE=GRACE):
        yield


def _cancelled_unsent(url: str, monkeypatch: pytest.MonkeyPatch) -> WebhookDelivery:
    """A queued turn cancelled by a producer that died before sending its delivery's message."""
    monkeypatch.setattr("worker.producer.send_end_delivery", _lose)
    session_id = create_session(framework="none", model="echo", webhook=url)
    turn = submit_turn(session_id, "never mind")
    assert cancel_turn(turn.turn_id).status.value == "cancelled"
    [row] = _rows(turn.turn_id)
    return row


@pytest.mark.timeout(60)
def test_an_end_whose_message_was_never_sent_is_delivered_by_the_sweep_once(
    in_process: InProcessWorker, receiver: Receiver, settings_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.runtime.webhooks.deliveries.send_end_delivery", _lose)
    url = receiver.answer("/end")
    session_id = create_session(framework="langgraph", model=STUB_MODEL, webhook=url)
    turn = submit_turn(session_id, "hello [words: 3]")
    assert wait_for_turn(turn.turn_id).status.value == "succeeded"
    in_process.wait_idle()
    # The end's commit recorded the delivery; no message was sent, so nothing was POSTed.
    [row] = _rows(turn.turn_id)
    assert (row.event, row.status, row.attempts, row.body) == (DeliveryEvent.ENDED, DeliveryStatus.PENDING, 0, None)
    assert receiver.received("/end") == []

    _due_for_a_minute(row.id)
    assert sweep_once(build_runtime()).webhooks >= 1
    send_delivery(row.id)  # and a late copy of a message, which must not make a second POST
    [got] = receiver.wait_for(1, "/end")
    in_process.wait_idle()
    assert len(receiver.received("/end")) == 1
    assert got.headers["x-chatq-delivery"] == str(row.id)
    assert got.headers["x-chatq-event"] == "turn.succeeded"
    report = turn_report(turn.turn_id)
    assert report["webhook"]["status"] == "delivered" and report["webhook"]["attempts"] == 1
    assert got.body.decode() == _rows(turn.turn_id)[0].body
    assert json.loads(got.body) == {key: value for key, value in report.items() if key != "webhook"}


def test_a_queued_turns_cancel_records_its_delivery_with_the_cancel(
    receiver: Receiver, settings_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _cancelled_unsent(receiver.answer("/cancel"), monkeypatch)
    assert (row.event, row.status, row.ordinal) == (DeliveryEvent.ENDED, DeliveryStatus.PENDING, 1)
    # Due now, for the message the dead producer never sent: the sweep leaves it for the grace.
    assert row.id not in {delivery_id for delivery_id, _ in take_lost_deliveries(build_runtime())}


def test_two_sweeps_at_once_take_a_lost_delivery_once(
    receiver: Receiver, settings_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _cancelled_unsent(receiver.answer("/twice"), monkeypatch)
    _due_for_a_minute(row.id)
    runtime = build_runtime()
    # One sweep's statement holds the row: the other skips it rather than wait or take it too.
    with session_scope() as db:
        db.execute(select(WebhookDelivery.id).where(WebhookDelivery.id == row.id).with_for_update())
        beside: list[uuid.UUID] = []
        thread = threading.Thread(target=lambda: beside.extend(i for i, _ in take_lost_deliveries(runtime)))
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "a sweep waited for another's row"
    assert row.id not in beside
    # Two sweeps racing on a free row: one takes it, and it is due (not lost) for the other.
    barrier = threading.Barrier(2)
    taken: list[uuid.UUID] = []

    def sweep() -> None:
        barrier.wait()
        taken.extend(i for i, _ in take_lost_deliveries(runtime))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert taken.count(row.id) == 1
    assert row.id not in {i for i, _ in take_lost_deliveries(runtime)}


def test_a_delivered_row_is_not_sent_again_and_a_row_not_due_is_not_attempted(
    receiver: Receiver, settings_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _cancelled_unsent(receiver.answer("/once"), monkeypatch)
    runtime = build_runtime()
    assert deliver(row.id, runtime=runtime).outcome is DeliveryOutcome.DELIVERED
    assert deliver(row.id, runtime=runtime).outcome is DeliveryOutcome.DONE  # a copy of its message
    _due_for_a_minute(row.id)
    assert row.id not in {i for i, _ in take_lost_deliveries(runtime)}
    assert deliver(row.id, runtime=runtime).outcome is DeliveryOutcome.DONE
    assert len(receiver.received("/once")) == 1
    [done] = _rows(row.turn_id)
    assert (done.status, done.attempts) == (DeliveryStatus.DELIVERED, 1)

    # A pending row whose next attempt is not due yet (a retry waits out its back-off): no POST.
    other = _cancelled_unsent(receiver.answer("/later"), monkeypatch)
    with session_scope() as db:
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == other.id)
            .values(next_attempt_at=text("now() + interval '60 seconds'"))
        )
    assert deliver(other.id, runtime=runtime).outcome is DeliveryOutcome.DONE
    assert receiver.received("/later") == []


def _due_for(delivery_id: uuid.UUID, seconds: float) -> None:
    with session_scope() as db:
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(next_attempt_at=text("now() - make_interval(secs => :s)").bindparams(s=seconds))
        )


def test_resends_no_worker_takes_wait_twice_as_long_each_time_and_a_taken_one_starts_over(
    receiver: Receiver, settings_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _cancelled_unsent(receiver.answer("/backoff"), monkeypatch)
    runtime = build_runtime()
    grace = float(GRACE)

    def resent_when_due_for(seconds: float) -> bool:
        _due_for(row.id, seconds)
        return row.id in {i for i, _ in take_lost_deliveries(runtime)}

    # The messages the sweep sends sit in a queue no worker takes from: each re-send waits longer.
    assert resent_when_due_for(grace + 1)  # the first: after one grace
    assert not resent_when_due_for(grace + 1) and resent_when_due_for(2 * grace + 1)  # then two
    assert not resent_when_due_for(2 * grace + 1) and resent_when_due_for(4 * grace + 1)  # then four
    assert _rows(row.turn_id)[0].resends == 3
    # Up to twenty graces, never more.
    with session_scope() as db:
        db.execute(update(WebhookDelivery).where(WebhookDelivery.id == row.id).values(resends=30))
    assert not resent_when_due_for(20 * grace - 1) and resent_when_due_for(20 * grace + 1)
    # A worker takes one of the messages: the delivery is made and the count is gone with the attempt.
    assert deliver(row.id, runtime=runtime).outcome is DeliveryOutcome.DELIVERED
    assert _rows(row.turn_id)[0].resends == 0
    assert len(receiver.received("/backoff")) == 1

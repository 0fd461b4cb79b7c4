"""A turn that pauses for approval is POSTed to its webhook at each pause, signed and retried like the
POST of its end (which still comes, once, last); and a call that waited is announced `started` once.

Turns and deliveries run in this process (`in_process`) against a real local receiver.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update

from models.db import session_scope
from models.tables import WebhookDelivery
from tests.integration.approvals.conftest import APPROVED
from tests.support.effects import lines
from tests.support.env import environ
from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.receiver import Received, Receiver
from tests.support.turns import replay_events, wait_for_status, wait_for_turn
from worker.producer import create_session, decide_tool_call, pending_approvals, submit_turn
from worker.queries import turn_report
from worker.runtime.recovery.sweeper import sweep_once

SECRET = "whsec-approvals-test-only-0123"
FRAMEWORKS = ("plain_openai", "langgraph")


@pytest.fixture
def in_process_env() -> dict[str, str]:
    return {
        "CHATQ_WEBHOOK_SECRET": SECRET,
        "CHATQ_WEBHOOK_ALLOW_PRIVATE": "1",
        "CHATQ_WEBHOOK_BACKOFF": "0.2",
        "CHATQ_WEBHOOK_RETRY_FOR": "5",
    }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with environ(CHATQ_WEBHOOK_ALLOW_PRIVATE="1"), Receiver() as server:  # the producer stores 127.0.0.1 URLs
        yield server


def _verify(received: Received) -> None:
    timestamp, delivery = received.headers["x-chatq-timestamp"], received.headers["x-chatq-delivery"]
    expected = hmac.new(SECRET.encode(), f"{timestamp}.{delivery}.".encode() + received.body, hashlib.sha256)
    assert hmac.compare_digest(received.headers["x-chatq-signature"], f"sha256={expected.hexdigest()}")


def _deliveries(turn_id: uuid.UUID) -> list[WebhookDelivery]:
    with session_scope() as db:
        query = select(WebhookDelivery).where(WebhookDelivery.turn_id == turn_id).order_by(WebhookDelivery.ordinal)
        rows = list(db.execute(query).scalars())
        db.expunge_all()
        return rows


def _wait_delivered(turn_id: uuid.UUID, count: int, *, timeout: float = 30.0) -> list[WebhookDelivery]:
    deadline = time.monotonic() + timeout
    while True:
        rows = _deliveries(turn_id)
        if len(rows) == count and all(row.status.value == "delivered" for row in rows):
            return rows
        assert time.monotonic() < deadline, [(r.event, r.status, r.attempts) for r in rows]
        time.sleep(0.05)


def _submit(framework: str, out: Path, *, rounds: int = 1, webhook: str | None = None) -> uuid.UUID:
    session_id = create_session(
        framework=framework, model="gpt-4o-mini", metadata={"tools": [APPROVED]}, webhook=webhook
    )
    return submit_turn(session_id, f'[rounds: {rounds} {APPROVED} {{"path": "{out}"}}]').turn_id


def _waiting_call(turn_id: uuid.UUID) -> dict[str, Any]:
    wait_for_status(turn_id, "awaiting_approval")
    [waiting] = [p for p in pending_approvals() if p["turn_id"] == str(turn_id)]
    [call] = waiting["calls"]
    return dict(call)


@pytest.mark.timeout(60)
def test_a_pause_posts_the_waiting_calls_signed_and_the_end_follows_in_order(
    in_process: InProcessWorker, receiver: Receiver, tmp_path: Path
) -> None:
    url = receiver.answer("/hook")
    out = tmp_path / "out.txt"
    turn_id = _submit("plain_openai", out, rounds=2, webhook=url)
    first = _waiting_call(turn_id)
    [paused] = receiver.wait_for(1, "/hook")
    _verify(paused)
    assert paused.headers["x-chatq-event"] == "turn.awaiting_approval"
    assert paused.headers["x-chatq-attempt"] == "1"
    body = json.loads(paused.body)
    [waiting] = [p for p in pending_approvals() if p["turn_id"] == str(turn_id)]
    assert body == {
        "id": str(turn_id),
        "session_id": waiting["session_id"],
        "status": "awaiting_approval",
        "calls": [{"id": first["id"], "name": APPROVED, "args": {"path": str(out)}}],
        "until": waiting["until"],
    }
    # GET /turns/{id}'s `webhook` is the end's delivery: not made while the turn is paused.
    assert turn_report(turn_id)["webhook"]["status"] is None

    decide_tool_call(turn_id, first["id"], approve=True)
    second = _waiting_call(turn_id)  # the model's second round pauses again
    assert second["id"] != first["id"]
    decide_tool_call(turn_id, second["id"], approve=False, reason="once is enough")
    assert wait_for_turn(turn_id).status.value == "succeeded"

    rows = _wait_delivered(turn_id, 3)
    assert [(r.event.value, r.ordinal) for r in rows] == [
        ("awaiting_approval", 1),
        ("awaiting_approval", 2),
        ("ended", 3),
    ]
    got = receiver.wait_for(3, "/hook")
    assert [r.headers["x-chatq-delivery"] for r in got] == [str(r.id) for r in rows]
    assert [r.headers["x-chatq-event"] for r in got] == ["turn.awaiting_approval"] * 2 + ["turn.succeeded"]
    for received in got:
        _verify(received)
    assert json.loads(got[1].body)["calls"] == [{"id": second["id"], "name": APPROVED, "args": {"path": str(out)}}]
    report = turn_report(turn_id)
    assert json.loads(got[2].body) == {key: value for key, value in report.items() if key != "webhook"}
    assert report["webhook"]["delivery_id"] == str(rows[2].id) and report["webhook"]["status"] == "delivered"
    assert lines(out) == [f"{turn_id}:{first['id']}"]


@pytest.mark.timeout(60)
def test_a_failing_receiver_gets_the_pause_again_with_the_same_id_and_bytes(
    in_process: InProcessWorker, receiver: Receiver, tmp_path: Path
) -> None:
    url = receiver.answer("/flaky", 500, 503, 200)
    turn_id = _submit("langgraph", tmp_path / "out.txt", webhook=url)
    _waiting_call(turn_id)
    [row] = _wait_delivered(turn_id, 1)
    assert row.attempts == 3 and row.last_status_code == 200 and row.event.value == "awaiting_approval"
    got = receiver.wait_for(3, "/flaky")
    assert [r.headers["x-chatq-attempt"] for r in got] == ["1", "2", "3"]
    assert {r.headers["x-chatq-delivery"] for r in got} == {str(row.id)}
    assert len({r.body for r in got}) == 1
    for received in got:
        _verify(received)


@pytest.mark.timeout(60)
def test_a_pause_whose_message_was_never_sent_is_delivered_by_the_sweep(
    in_process: InProcessWorker, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process that paused the turn died right after the pause's commit, before sending the message.
    monkeypatch.setattr("worker.runtime.delivery.paused.send_delivery", lambda *_, **__: None)
    url = receiver.answer("/lost")
    turn_id = _submit("plain_openai", tmp_path / "out.txt", webhook=url)
    _waiting_call(turn_id)
    in_process.wait_idle()
    [row] = _deliveries(turn_id)
    assert (row.event.value, row.status.value, row.attempts) == ("awaiting_approval", "pending", 0)
    assert receiver.received("/lost") == []
    with session_scope() as db:  # due for a minute (CHATQ_REQUEUE_GRACE is 3 s here): its message is lost
        db.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == row.id)
            .values(next_attempt_at=text("now() - interval '60 seconds'"))
        )
    assert sweep_once(build_runtime()).webhooks >= 1
    [got] = receiver.wait_for(1, "/lost")
    [done] = _wait_delivered(turn_id, 1)
    assert got.headers["x-chatq-delivery"] == str(row.id) and done.attempts == 1
    assert got.headers["x-chatq-event"] == "turn.awaiting_approval"
    assert got.body.decode() == row.body
    _verify(got)


@pytest.mark.timeout(60)
def test_without_a_webhook_a_pause_records_no_delivery(in_process: InProcessWorker, tmp_path: Path) -> None:
    turn_id = _submit("plain_openai", tmp_path / "out.txt")
    call = _waiting_call(turn_id)
    assert _deliveries(turn_id) == []
    decide_tool_call(turn_id, call["id"], approve=True)
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert _deliveries(turn_id) == [] and turn_report(turn_id)["webhook"] is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_call_that_waited_for_approval_is_announced_started_once(
    framework: str, in_process: InProcessWorker, redis_url: str, tmp_path: Path
) -> None:
    turn_id = _submit(framework, tmp_path / "out.txt")
    call = _waiting_call(turn_id)
    decide_tool_call(turn_id, call["id"], approve=True)
    assert wait_for_turn(turn_id).status.value == "succeeded"
    events = replay_events(redis_url, turn_id)
    tool = [(e["type"], e["tool"]["status"]) if e["type"] == "tool" else (e["type"], "") for e in events]
    tool = [t for t in tool if t[0] in ("tool", "approval_required")]
    # Announced when it runs, after the decision: the pause itself started nothing.
    assert tool == [("approval_required", ""), ("tool", "started"), ("tool", "finished")]
    assert [e["tool"]["id"] for e in events if e["type"] == "tool"] == [call["id"], call["id"]]

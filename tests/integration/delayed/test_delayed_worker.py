"""A real `chatq worker` fires a delayed turn itself (its due timer, no beat): the turn's first model
request comes no earlier than its due time and within 2 s after it (CHATQ_DUE_INTERVAL is 1 s: up to
1 s for the timer's round, then the send, the claim and the turn's start)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from models.tables import TurnStatus
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import wait_for_turn
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def test_a_delayed_turn_starts_when_due(
    worker: WorkerProcess, openai_stub: OpenAIStub, record_property: pytest.RecordProperty
) -> None:
    text = f"wake me at the due time {uuid.uuid4().hex}"
    session_id = create_session(framework="none", model=STUB_MODEL)
    # A first turn warms the worker (its first turn's imports and model client), so what is measured
    # is the due timer's lateness and the start of a turn, not a cold start.
    warm = submit_turn(session_id, "warm up")
    assert wait_for_turn(warm.turn_id, timeout=30).status is TurnStatus.SUCCEEDED
    turn = submit_turn(session_id, text, delay=2.0)
    assert turn.run_at is not None
    due = turn.run_at.timestamp()
    first: float | None = None
    deadline = time.time() + 15
    while first is None and time.time() < deadline:
        if any(text in str(message.get("content")) for r in openai_stub.requests for message in r.get("messages", [])):
            first = time.time()
        else:
            time.sleep(0.01)
    assert first is not None, worker.log()[-3000:]
    late = first - due
    record_property("delayed_turn_start_after_due_s", round(late, 3))
    print(f"delayed turn: first model request {late:+.3f} s after its due time ({datetime.now(UTC).isoformat()})")
    row = wait_for_turn(turn.turn_id, timeout=20)
    assert row.status is TurnStatus.SUCCEEDED
    assert row.enqueued_at is not None and row.started_at is not None
    released, started = row.enqueued_at.timestamp() - due, row.started_at.timestamp() - due
    print(f"  released {released:+.3f} s, claimed {started:+.3f} s after its due time")
    assert 0 <= late <= 2.0, late

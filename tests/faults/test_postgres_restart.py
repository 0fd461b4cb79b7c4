"""Postgres restarting while turns run: none lost, none duplicated, the worker reconnects by itself."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import OperationalError

from models.db import get_engine, session_scope
from models.tables import Turn, TurnStatus
from tests.faults.helpers import (
    STUB_MODEL,
    Beat,
    PostgresControl,
    Workers,
    assert_each_turn_answered_once,
    wait_finished,
    wait_status,
)
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events
from worker.payload import TurnRequest
from worker.producer import create_session, submit_turn

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

SESSIONS, TURNS = 3, 10
TEXT = "[slow: 0.05] [words: 20]"


@pytest.mark.timeout(150)
def test_turns_running_across_a_postgres_restart_all_succeed_once(
    postgres: PostgresControl, workers: Workers, beat: Beat
) -> None:
    worker = workers.one(concurrency=8)
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(SESSIONS)]
    submitted: list[tuple[uuid.UUID, uuid.UUID, str]] = []
    for index in range(TURNS):
        session_id = sessions[index % SESSIONS]
        content = f"turn {index} {TEXT}"
        submitted.append((submit_turn(session_id, content).turn_id, session_id, content))
    turn_ids = [turn_id for turn_id, _, _ in submitted]
    wait_status(turn_ids[0], "running", timeout=30)
    time.sleep(0.3)  # mid-stream

    outage = postgres.restart()
    restarted_at = time.monotonic()
    print(f"\nPostgres ({postgres.description}) restarted in {outage:.1f}s")

    rows = wait_finished(turn_ids, timeout=100)
    print(f"all {len(turn_ids)} turns finished {time.monotonic() - restarted_at:.1f}s after the restart")
    assert_each_turn_answered_once(rows, {s: [c for _, sid, c in submitted if sid == s] for s in sessions})

    assert worker.alive, worker.log()[-3000:]
    after = submit_turn(sessions[0], "still there after the restart? [words: 3]")
    row = wait_finished([after.turn_id], timeout=30)[after.turn_id]
    assert row.status.value == "succeeded", row.error
    assert worker.alive


# --- a Postgres outage inside the handler ---------------------------------------------------------


def _database_down(*_: Any, **__: Any) -> Any:
    raise OperationalError(
        "SELECT chat_messages", {}, psycopg.OperationalError("connection refused: the server is restarting")
    )


@pytest.mark.timeout(60)
def test_postgres_down_while_the_handler_reads_history_is_not_charged_to_the_agent(
    stub_env: OpenAIStub, chatq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """SPEC: infrastructure faults (Postgres restarting) never lose a turn.

    The store reads the session's history from Postgres after the claim, before the handler runs
    (models.history). If Postgres is gone at that moment (the claim just before it succeeded),
    that is an infrastructure fault like any other: the delivery should be retried, not counted as
    a failed model invocation. Two such deliveries must not fail the turn with "The agent failed
    (OperationalError)." This process runs the deliveries itself (execute_turn, as the task does)
    against the model stub.
    """
    import models.history
    from worker.runtime.delivery.runner import execute_turn
    from worker.runtime.intake.tasks import INFRASTRUCTURE_ERRORS
    from worker.store.claims import ensure_turn

    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    request = TurnRequest(turn_id=uuid.uuid4(), session_id=session_id, content="hello [words: 3]")
    assert ensure_turn(request, queue="chatq", engine=get_engine())

    outcomes: list[str] = []

    def deliver() -> None:
        try:
            outcomes.append(
                execute_turn(request, queue="chatq", worker="fault-test@local", runtime=build_runtime()).outcome.value
            )
        except INFRASTRUCTURE_ERRORS as exc:
            outcomes.append(f"infrastructure error ({type(exc).__name__})")
        # Whatever this delivery left running, its lease runs out before the next one (as after a retry).
        with session_scope() as db:
            db.execute(
                update(Turn)
                .where(Turn.id == request.turn_id, Turn.status == TurnStatus.RUNNING)
                .values(lease_expires_at=text("now() - interval '1 second'"))
            )

    with monkeypatch.context() as patch:
        patch.setattr(models.history, "autocommit_scope", _database_down)
        deliver()
        deliver()
    deliver()  # Postgres is back

    row = wait_finished([request.turn_id], timeout=10)[request.turn_id]
    events = [(e["type"], e.get("error")) for e in replay_events(redis_url, request.turn_id) if e["type"] != "text"]
    assert row.status.value == "succeeded", (
        f"the turn ended {row.status.value} ({row.error!r}) after deliveries {outcomes}; events {events}"
    )

"""Cancellation through the producer API: queued and running turns, and submit_turn's if_busy policies."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, Turn, TurnStatus
from tests.faults.helpers import STUB_MODEL, Worker, Workers, event_types, wait_finished, wait_for_event, wait_status
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.errors import SessionBusy
from worker.producer import cancel_turn, create_session, submit_turn

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("worker")]

SLOW = "[words: 60] [slow: 0.1]"
"""About six seconds of streaming."""


@pytest.fixture(scope="module")
def module_worker(worker_env: dict[str, str]) -> Iterator[Worker]:
    """One worker for the module: its tests are about cancelling through the producer (each on
    sessions of its own), not about the worker's life, and a start-up costs seconds of CPU."""
    pool = Workers(worker_env)
    try:
        yield pool.one()
    finally:
        pool.kill_all()


@pytest.fixture
def worker(module_worker: Worker) -> Iterator[Worker]:
    """The module's worker, alive at the start of each test; the end of its log is printed after
    the test (shown only when it failed)."""
    assert module_worker.alive, module_worker.log()[-3000:]
    yield module_worker
    print(f"--- worker {module_worker.name} ---\n{module_worker.log()[-3000:]}")


def _counts(session_id: uuid.UUID) -> tuple[int, int]:
    with session_scope() as db:
        turns = db.execute(select(func.count()).select_from(Turn).where(Turn.session_id == session_id)).scalar_one()
        messages = db.execute(
            select(func.count()).select_from(ChatMessage).where(ChatMessage.session_id == session_id)
        ).scalar_one()
    return int(turns), int(messages)


def _ran_after(later: Turn, earlier: Turn) -> bool:
    """`later` started only once `earlier` had finished."""
    return later.started_at is not None and earlier.finished_at is not None and later.started_at >= earlier.finished_at


@pytest.mark.timeout(60)
def test_a_queued_turn_cancelled_never_runs_and_the_session_moves_on(redis_url: str) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    ahead = submit_turn(session_id, "first, slowly [words: 20] [slow: 0.1]")
    queued = submit_turn(session_id, "never mind this one")
    wait_status(ahead.turn_id, "running", timeout=20)

    first = cancel_turn(queued.turn_id)
    assert first.status is TurnStatus.CANCELLED and not first.already
    again = cancel_turn(queued.turn_id)  # idempotent, and says so
    assert again.status is TurnStatus.CANCELLED and again.already
    later = submit_turn(session_id, "and then this [words: 3]")

    rows = wait_finished([ahead.turn_id, queued.turn_id, later.turn_id], timeout=45)
    assert rows[ahead.turn_id].status.value == "succeeded"
    assert rows[queued.turn_id].status.value == "cancelled"
    assert rows[later.turn_id].status.value == "succeeded", rows[later.turn_id].error
    assert rows[queued.turn_id].started_at is None and rows[queued.turn_id].attempts == 0
    assert _ran_after(rows[later.turn_id], rows[ahead.turn_id])
    assert event_types(redis_url, queued.turn_id) == ["queued", "cancelled"]
    assert [m.role for m in turn_messages(queued.turn_id)] == ["user"]
    assert [m.role for m in turn_messages(later.turn_id)] == ["user", "assistant"]


@pytest.mark.timeout(60)
def test_a_running_turn_cancelled_stops_within_two_seconds_and_stores_nothing(redis_url: str) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    running = submit_turn(session_id, f"go on and on {SLOW}")
    following = submit_turn(session_id, "the next question [words: 3]")
    wait_for_event(redis_url, running.turn_id, "text", count=3, timeout=20)

    asked_at = time.monotonic()
    asked = cancel_turn(running.turn_id)
    assert asked.status is TurnStatus.RUNNING and not asked.already
    assert cancel_turn(running.turn_id).already  # asked to stop already: not a new cancel
    row = wait_status(running.turn_id, "cancelled", timeout=10)
    stop_seconds = time.monotonic() - asked_at
    print(f"\nrunning turn cancelled after {stop_seconds:.2f}s")
    assert stop_seconds < 2.5
    assert row.error is None and row.finished_at is not None

    wait_finished([following.turn_id], timeout=30)
    events = replay_events(redis_url, running.turn_id)
    types = [event["type"] for event in events]
    assert types[-1] == "cancelled" and types.count("cancelled") == 1
    assert "final" not in types and "error" not in types
    assert [m.role for m in turn_messages(running.turn_id)] == ["user"]
    with session_scope() as db:
        nxt = db.get(Turn, following.turn_id)
    assert nxt is not None and nxt.status.value == "succeeded", nxt.error if nxt else None
    assert [m.role for m in turn_messages(following.turn_id)] == ["user", "assistant"]


STALL_SECONDS = 60.0
"""How long the silent model sends nothing: a cancel must not wait for it."""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("framework", ["langgraph", "plain_openai"])
def test_a_turn_whose_model_sends_nothing_is_cancelled_at_once(
    redis_url: str, openai_stub: OpenAIStub, framework: str
) -> None:
    session_id = create_session(framework=framework, model=STUB_MODEL)
    marker = uuid.uuid4().hex
    silent = submit_turn(session_id, f"think hard {marker} [sleep: {STALL_SECONDS:g}]")
    following = submit_turn(session_id, "the next question [words: 3]")
    # The model has the request and says nothing: the worker is blocked in its socket read.
    _wait_until(lambda: any(marker in json.dumps(body) for body in openai_stub.requests), timeout=20)

    asked_at = time.monotonic()
    assert cancel_turn(silent.turn_id).status is TurnStatus.RUNNING
    wait_status(silent.turn_id, "cancelled", timeout=STALL_SECONDS)
    stop_seconds = time.monotonic() - asked_at
    rows = wait_finished([following.turn_id], timeout=STALL_SECONDS)
    next_done = time.monotonic() - asked_at
    print(f"\nsilent {framework} turn cancelled after {stop_seconds:.2f}s; next turn done after {next_done:.2f}s")
    # Without closing the request the cancel would wait out the stall (or the turn timeout).
    assert stop_seconds < 2.0
    assert next_done < STALL_SECONDS / 4
    assert rows[following.turn_id].status.value == "succeeded", rows[following.turn_id].error

    types = event_types(redis_url, silent.turn_id)
    assert types[-1] == "cancelled" and types.count("cancelled") == 1
    assert "final" not in types and "error" not in types and "retry" not in types
    assert [m.role for m in turn_messages(silent.turn_id)] == ["user"]
    with session_scope() as db:
        row = db.get(Turn, silent.turn_id)
        assert row is not None and row.error is None and row.attempts == 1
    assert [m.role for m in turn_messages(following.turn_id)] == ["user", "assistant"]


def _wait_until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_if_busy_reject_stores_nothing_and_interrupt_replaces_the_running_turn(redis_url: str) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    busy = submit_turn(session_id, f"a long one {SLOW}")
    wait_for_event(redis_url, busy.turn_id, "text", count=2, timeout=20)

    before = _counts(session_id)
    rejected_id = uuid.uuid4()
    with pytest.raises(SessionBusy):
        submit_turn(session_id, "me too", turn_id=rejected_id, if_busy="reject")
    assert _counts(session_id) == before
    with session_scope() as db:
        assert db.get(Turn, rejected_id) is None
    assert event_types(redis_url, rejected_id) == []

    interrupting = submit_turn(session_id, "stop that, answer this [words: 5]", if_busy="interrupt")
    assert interrupting.cancelled == [busy.turn_id]
    rows = wait_finished([busy.turn_id, interrupting.turn_id], timeout=30)
    assert rows[busy.turn_id].status.value == "cancelled"
    assert rows[interrupting.turn_id].status.value == "succeeded", rows[interrupting.turn_id].error
    assert _ran_after(rows[interrupting.turn_id], rows[busy.turn_id])
    busy_types = event_types(redis_url, busy.turn_id)
    assert busy_types[-1] == "cancelled" and busy_types.count("cancelled") == 1 and "final" not in busy_types
    assert [m.role for m in turn_messages(busy.turn_id)] == ["user"]
    assert [m.role for m in turn_messages(interrupting.turn_id)] == ["user", "assistant"]
    assert event_types(redis_url, interrupting.turn_id)[-1] == "final"

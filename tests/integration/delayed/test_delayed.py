"""Delayed turns against the real Postgres and Redis, no worker consuming (the queue is read as it is):
stored at once, released by the due step (`release_due_turns`) when due and only then, once however
many workers race, cancelled and deleted like other turns, and recovered by the sweep when the send
after the release is lost."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import delete, func, select

from chatq.settings import reset_settings
from models.db import get_engine, session_scope
from models.tables import ChatMessage, ChatSession, DeliveryEvent, Turn, TurnStatus, WebhookDelivery
from tests.support.inprocess import build_runtime
from tests.support.turns import replay_events
from worker.errors import InvalidTurn, TurnConflict
from worker.producer import cancel_turn, create_session, delete_session, list_turns, submit_turn
from worker.queries import turn_report
from worker.runtime.recovery.due_timer import DueTimer
from worker.runtime.recovery.due_turns import release_due_turns
from worker.runtime.recovery.sweeper import sweep_once
from worker.store import turns
from worker.store.delayed import release_due

HOUR = timedelta(hours=1)


@pytest.fixture
def client(chatq_env: dict[str, str]) -> Iterator[redis.Redis]:
    """The test's Redis, its turn queue emptied; the sweep's grace 0 (a message not waiting is lost).
    No delayed turn of another test is left to be released by this one's due steps."""
    os.environ["CHATQ_REQUEUE_GRACE"] = "0"
    reset_settings()
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    client.delete("chatq", "chatq.batch")
    _drop_delayed()
    yield client
    _drop_delayed()
    client.delete("chatq", "chatq.batch")
    client.close()
    os.environ.pop("CHATQ_REQUEUE_GRACE", None)
    reset_settings()


def _drop_delayed() -> None:
    with session_scope() as db:
        db.execute(delete(Turn).where(Turn.status == TurnStatus.DELAYED))


def _sent(client: redis.Redis, *turn_ids: uuid.UUID) -> Counter[str]:
    """How often each of these turns' task messages waits in the queue."""
    wanted = {str(turn_id) for turn_id in turn_ids}
    ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange("chatq", 0, -1)]
    return Counter(i for i in ids if i in wanted)


def _row(turn_id: uuid.UUID) -> Turn | None:
    with session_scope() as db:
        row = db.get(Turn, turn_id)
        if row is not None:
            db.expunge(row)
        return row


def _messages(turn_id: uuid.UUID) -> list[tuple[int, str, str]]:
    with session_scope() as db:
        rows = db.execute(select(ChatMessage).where(ChatMessage.turn_id == turn_id)).scalars()
        return [(m.position, m.role, m.content) for m in rows]


def _count_turns(session_id: uuid.UUID) -> int:
    with session_scope() as db:
        return int(db.execute(select(func.count()).select_from(Turn).where(Turn.session_id == session_id)).scalar_one())


def test_a_delayed_turn_is_stored_at_once_and_released_only_when_due(client: redis.Redis, redis_url: str) -> None:
    sid = create_session(framework="none", model="echo")
    run_at = datetime.now(UTC) + HOUR
    delayed = submit_turn(sid, "later", run_at=run_at, images=["https://example.com/a.png"])
    assert delayed.created and delayed.position is None and delayed.run_at == run_at and not delayed.sent
    # Stored and visible at once, with its due time; no position, no message, nothing sent or published.
    report = turn_report(delayed.turn_id)
    assert (report["status"], report["position"], report["messages"]) == ("delayed", None, [])
    assert datetime.fromisoformat(report["run_at"]) == run_at
    assert _sent(client, delayed.turn_id) == Counter() and replay_events(redis_url, delayed.turn_id) == []
    # Turns submitted meanwhile run past it: the first of them is the session's head.
    now_turns = [submit_turn(sid, "now 1"), submit_turn(sid, "now 2")]
    assert [t.position for t in now_turns] == [0, 1]
    nxt = turns.next_runnable(sid, engine=get_engine())
    assert nxt is not None and nxt.turn_id == now_turns[0].turn_id

    runtime = build_runtime()
    assert release_due_turns(runtime, now=run_at - timedelta(seconds=1)) == 0
    row = _row(delayed.turn_id)
    assert row is not None and row.status is TurnStatus.DELAYED and _messages(delayed.turn_id) == []

    assert release_due_turns(runtime, now=run_at) == 1
    row = _row(delayed.turn_id)
    # In order from its due time: after the turns submitted before it was due.
    assert row is not None and (row.status, row.position, row.pending_input) == (TurnStatus.QUEUED, 2, None)
    assert row.run_at == run_at
    assert _messages(delayed.turn_id) == [(2000, "user", "later")]
    with session_scope() as db:
        images = db.execute(select(ChatMessage.images).where(ChatMessage.turn_id == delayed.turn_id)).scalar_one()
        next_position = db.execute(select(ChatSession.next_turn_position).where(ChatSession.id == sid)).scalar_one()
    assert images == ["https://example.com/a.png"] and next_position == 3
    assert _sent(client, delayed.turn_id) == Counter({str(delayed.turn_id): 1})
    assert [e["type"] for e in replay_events(redis_url, delayed.turn_id)] == ["queued"]
    assert replay_events(redis_url, delayed.turn_id)[0]["position"] == 2
    # Released once: a later round finds nothing.
    assert release_due_turns(runtime, now=run_at + HOUR) == 0
    assert _sent(client, delayed.turn_id) == Counter({str(delayed.turn_id): 1})


def test_a_short_delay_is_released_by_the_database_clock(client: redis.Redis) -> None:
    sid = create_session(framework="none", model="echo")
    turn = submit_turn(sid, "soon", delay=0.3)
    runtime = build_runtime()
    assert release_due_turns(runtime) == 0
    threading.Event().wait(0.5)
    assert release_due_turns(runtime) == 1
    row = _row(turn.turn_id)
    assert row is not None and (row.status, row.position) == (TurnStatus.QUEUED, 0)


def test_racing_due_steps_release_each_turn_once_and_send_it_once(client: redis.Redis) -> None:
    sessions = [create_session(framework="none", model="echo") for _ in range(3)]
    run_at = datetime.now(UTC) + HOUR
    delayed = [submit_turn(sessions[i % 3], f"turn {i}", run_at=run_at + timedelta(milliseconds=i)) for i in range(24)]
    runtime = build_runtime()
    start = threading.Barrier(6)
    counts: list[int] = []

    def step() -> None:
        start.wait()
        counts.append(release_due_turns(runtime, now=run_at + HOUR, limit=2))

    threads = [threading.Thread(target=step) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 24
    assert _sent(client, *(t.turn_id for t in delayed)) == Counter({str(t.turn_id): 1 for t in delayed})
    with session_scope() as db:
        for sid in sessions:
            rows = db.execute(select(Turn).where(Turn.session_id == sid).order_by(Turn.position)).scalars().all()
            # Each session's turns took consecutive positions, in the order they were due.
            assert [r.position for r in rows] == list(range(8))
            assert all(r.status is TurnStatus.QUEUED for r in rows)
            assert [r.run_at for r in rows] == sorted(r.run_at for r in rows)
            users = db.execute(select(func.count()).where(ChatMessage.session_id == sid)).scalar_one()
            assert users == 8


def test_cancel_before_due_stores_nothing_more_and_ends_it_once(client: redis.Redis, redis_url: str) -> None:
    sid = create_session(framework="none", model="echo", webhook="https://example.com/hook")
    run_at = datetime.now(UTC) + HOUR
    turn = submit_turn(sid, "never", run_at=run_at)
    done = cancel_turn(turn.turn_id)
    assert (done.status, done.already) == (TurnStatus.CANCELLED, False)
    assert cancel_turn(turn.turn_id).already
    assert release_due_turns(build_runtime(), now=run_at + HOUR) == 0
    row = _row(turn.turn_id)
    assert row is not None and (row.status, row.position, row.pending_input) == (TurnStatus.CANCELLED, None, None)
    assert row.finished_at is not None
    assert _messages(turn.turn_id) == [] and _sent(client, turn.turn_id) == Counter()
    assert [e["type"] for e in replay_events(redis_url, turn.turn_id)] == ["cancelled"]
    with session_scope() as db:
        events = db.execute(select(WebhookDelivery.event).where(WebhookDelivery.turn_id == turn.turn_id)).all()
    assert [e for (e,) in events] == [DeliveryEvent.ENDED]
    # Not in the session's history: it never took a place there.
    assert list_turns(sid).turns == []


def test_deleting_the_session_removes_a_delayed_turn(client: redis.Redis) -> None:
    sid = create_session(framework="none", model="echo")
    run_at = datetime.now(UTC) + HOUR
    turn = submit_turn(sid, "gone", run_at=run_at)
    report = delete_session(sid)
    assert report.turns == 1
    assert _row(turn.turn_id) is None
    assert release_due_turns(build_runtime(), now=run_at + HOUR) == 0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"run_at": datetime.now(UTC) + HOUR, "delay": 5}, "not both"),
        ({"run_at": datetime(2030, 1, 1, 9, 0)}, "has no timezone"),
        ({"run_at": "2030-01-01T09:00:00+00:00"}, "must be a datetime"),
        ({"delay": -1}, "delay must be a number of seconds >= 0"),
        ({"delay": "90s"}, "delay must be a number"),
        ({"delay": float("nan")}, "delay must be a number"),
        ({"delay": True}, "delay must be a number"),
        ({"delay": 400 * 86400}, "more than 366 days"),
        ({"run_at": datetime.now(UTC) + timedelta(days=400)}, "more than 366 days"),
        ({"delay": 60, "if_busy": "reject"}, "cannot be combined with a delay"),
        ({"delay": 60, "if_busy": "interrupt"}, "cannot be combined with a delay"),
    ],
)
def test_bad_times_are_one_line_errors_and_store_nothing(
    client: redis.Redis, kwargs: dict[str, object], says: str
) -> None:
    sid = create_session(framework="none", model="echo")
    with pytest.raises(InvalidTurn) as raised:
        submit_turn(sid, "x", **kwargs)
    assert says in str(raised.value) and "\n" not in str(raised.value)
    assert _count_turns(sid) == 0 and client.llen("chatq") == 0


def test_a_time_not_ahead_or_a_zero_delay_is_now(client: redis.Redis) -> None:
    sid = create_session(framework="none", model="echo")
    past = submit_turn(sid, "past", run_at=datetime.now(UTC) - HOUR)
    zero = submit_turn(sid, "zero", delay=0)
    assert (past.position, zero.position, past.run_at, zero.run_at) == (0, 1, None, None)
    assert _sent(client, past.turn_id, zero.turn_id) == Counter({str(past.turn_id): 1, str(zero.turn_id): 1})


def test_resubmitting_a_delayed_turn_is_idempotent(client: redis.Redis) -> None:
    sid = create_session(framework="none", model="echo")
    run_at = datetime.now(UTC) + HOUR
    first = submit_turn(sid, "same", run_at=run_at)
    again = submit_turn(sid, "same", run_at=run_at, turn_id=first.turn_id)
    assert (again.created, again.run_at, again.position) == (False, run_at, None)
    with pytest.raises(TurnConflict, match="already exists"):
        submit_turn(sid, "other", run_at=run_at, turn_id=first.turn_id)


def test_a_lost_send_after_the_release_is_recovered_by_the_sweep(client: redis.Redis) -> None:
    sid = create_session(framework="none", model="echo")
    run_at = datetime.now(UTC) + HOUR
    turn = submit_turn(sid, "lost", run_at=run_at)
    # The release commits, then the process dies before it sends: nothing is in the queue.
    released = release_due(engine=get_engine(), now=run_at)
    assert [r.turn_id for r in released] == [turn.turn_id] and _sent(client, turn.turn_id) == Counter()
    report = sweep_once(build_runtime())
    assert report.resent >= 1
    assert _sent(client, turn.turn_id) == Counter({str(turn.turn_id): 1})


def test_the_due_timer_runs_its_steps_past_a_failing_one(client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []

    def broken(runtime: object) -> int:
        failures.append(1)
        raise ConnectionError("postgres is down")

    sid = create_session(framework="none", model="echo")
    turn = submit_turn(sid, "timer", delay=0.2)
    timer = DueTimer(interval=0.05, runtime=build_runtime(), steps=(broken, release_due_turns))
    with caplog.at_level(logging.DEBUG, logger="worker.runtime.recovery.due_timer"):
        timer.start()
        try:
            deadline = time.monotonic() + 10
            while (row := _row(turn.turn_id)) is not None and row.status is TurnStatus.DELAYED:
                assert time.monotonic() < deadline, "the due timer did not release the turn"
                time.sleep(0.02)
        finally:
            timer.stop()
            assert timer.join()
    assert row is not None and row.status is TurnStatus.QUEUED
    assert _sent(client, turn.turn_id) == Counter({str(turn.turn_id): 1})
    # The failing step was tried every round, and said so once at WARNING.
    assert len(failures) >= 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "due step broken failed" in r.message]
    assert len(warnings) == 1

"""Retention (CHATQ_RETENTION_DAYS) against the real Postgres and Redis: which sessions the sweep purges, and how."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from chatq.settings import get_settings
from models.db import session_scope
from models.tables import ChatSession, Turn
from tests.support.env import environ
from worker.deletion import purge_idle_sessions
from worker.producer import cancel_turn, create_session, submit_turn
from worker.queries import usage_report
from worker.runtime.recovery.sweeper import purge_expired

pytestmark = pytest.mark.usefixtures("chatq_env")


def _idle(session_id: uuid.UUID, days: float) -> None:
    """Make a session look idle for `days` (as if its last turn was submitted then)."""
    with session_scope() as db:
        db.execute(
            update(ChatSession)
            .where(ChatSession.id == session_id)
            .values(last_active_at=func.now() - timedelta(days=days))
        )


def _exists(session_id: uuid.UUID) -> bool:
    with session_scope() as db:
        return db.get(ChatSession, session_id) is not None


@pytest.fixture
def idle_sessions() -> Iterator[list[uuid.UUID]]:
    """Three sessions idle for 40 days, with a finished (cancelled) turn each."""
    created = []
    for _ in range(3):
        sid = create_session(framework="none")
        cancel_turn(submit_turn(sid, "old news").turn_id)
        _idle(sid, 40)
        created.append(sid)
    yield created
    for sid in created:  # what a failing test left behind must not meet the next test
        _idle(sid, 0)


def test_the_sweep_purges_idle_sessions_and_keeps_busy_and_recent_ones(idle_sessions: list[uuid.UUID]) -> None:
    busy = create_session(framework="none")
    submit_turn(busy, "still queued")
    _idle(busy, 40)
    recent = create_session(framework="none")
    _idle(recent, 20)
    before = usage_report()["turns"]
    with environ(CHATQ_RETENTION_DAYS="30"):
        purged = purge_expired(get_settings())
    assert purged >= 3
    assert not any(_exists(sid) for sid in idle_sessions)
    assert _exists(busy), "a session with an unfinished turn is never purged"
    assert _exists(recent)
    assert usage_report()["turns"] == before, "the purged turns still count, rolled up"
    with session_scope() as db:
        left = db.execute(select(func.count()).select_from(Turn).where(Turn.session_id.in_(idle_sessions)))
        assert left.scalar_one() == 0
    _idle(busy, 0)


def test_without_retention_days_nothing_is_purged(idle_sessions: list[uuid.UUID]) -> None:
    assert purge_expired(get_settings()) == 0
    assert all(_exists(sid) for sid in idle_sessions)


def test_purging_goes_in_bounded_batches(idle_sessions: list[uuid.UUID]) -> None:
    assert purge_idle_sessions(30, batch=2, batches=1) == 2
    assert sum(_exists(sid) for sid in idle_sessions) == 1
    assert purge_idle_sessions(30, batch=2, batches=5) == 1


def test_a_session_another_transaction_holds_is_skipped_not_waited_for(idle_sessions: list[uuid.UUID]) -> None:
    held = idle_sessions[0]
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        # As a turn being submitted holds it (INSERT_TURN updates the session row).
        with session_scope() as db:
            db.execute(select(ChatSession).where(ChatSession.id == held).with_for_update())
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        assert purge_idle_sessions(30) == 2
        assert _exists(held)
    finally:
        release.set()
        holder.join()
    assert purge_idle_sessions(30) == 1
    assert not _exists(held)

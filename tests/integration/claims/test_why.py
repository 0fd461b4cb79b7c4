"""Why a claim took nothing, read without writing, and the transitions a claim makes beside the claim
statement (take-over, cancel, poison), against the real Postgres, no worker.

Both claim paths run every case: `claim_turn` (the claim statement first) and `_claim_slow` (the
read-only `WHY_NOT_CLAIMED` first).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select, text, update

from chatq.settings import get_settings
from models.db import get_engine, session_scope
from models.knowledge import create_knowledge_base
from models.tables import Turn, TurnStatus
from worker.producer import cancel_turn, create_session, submit_turn
from worker.runtime.delivery.relay import handler_session
from worker.runtime.recovery.sweeper import stale_turns
from worker.store import transition_sql as sql
from worker.store.claims import (
    ClaimedSession,
    ClaimResult,
    ClaimStatus,
    _claim_slow,
    claim_turn,
    request_cancel,
    take_over,
)

pytestmark = pytest.mark.usefixtures("chatq_env")

Claimer = Callable[..., ClaimResult]
CLAIMERS = [pytest.param(claim_turn, id="claim_turn"), pytest.param(_claim_slow, id="slow_path")]


def _session(**kwargs: Any) -> uuid.UUID:
    return create_session(framework="none", model="echo", **kwargs)


def _row(turn_id: uuid.UUID) -> dict[str, Any]:
    """Every column of the turn's row."""
    with session_scope() as db:
        row = db.execute(select(Turn.__table__).where(Turn.__table__.c.id == turn_id)).mappings().one()
        return dict(row)


def _stop(turn_id: uuid.UUID) -> None:
    """The worker running the turn died: its lease ran out."""
    with session_scope() as db:
        db.execute(update(Turn).where(Turn.id == turn_id).values(lease_expires_at=text("now() - interval '5 seconds'")))


def _why(turn_id: uuid.UUID, session_id: uuid.UUID | None = None) -> str | None:
    """`WHY_NOT_CLAIMED` in a read-only transaction: Postgres refuses any write in it."""
    params = {"turn_id": turn_id, "session_id": session_id, "max_deliveries": get_settings().max_deliveries}
    with get_engine().connect() as connection, connection.begin():
        connection.execute(text("SET TRANSACTION READ ONLY"))
        row = connection.execute(sql.WHY_NOT_CLAIMED, params).one_or_none()
    return None if row is None else str(row.why)


def _node(name: str, host: str = "host-a") -> str:
    """A Celery node name, unique to this test (the database is shared by the run's tests)."""
    return f"{name}-{uuid.uuid4().hex[:8]}@{host}"


def _claimed(sid: uuid.UUID, worker: str = "w@host-a") -> uuid.UUID:
    turn_id = submit_turn(sid, "hello").turn_id
    assert (
        claim_turn(turn_id, worker=worker, engine=get_engine(), settings=get_settings()).status is ClaimStatus.CLAIMED
    )
    return turn_id


@pytest.mark.parametrize("claim", CLAIMERS)
def test_a_claim_that_takes_nothing_says_why_and_writes_nothing(claim: Claimer) -> None:
    sid, other = _session(), _session()
    running = _claimed(sid)
    blocked = submit_turn(sid, "after the running one").turn_id
    finished = submit_turn(other, "cancelled while queued").turn_id
    cancel_turn(finished)
    queued = submit_turn(_session(), "queued").turn_id
    cases = [
        (uuid.uuid4(), None, None, ClaimStatus.NOT_FOUND),
        (queued, other, "conflict", ClaimStatus.CONFLICT),
        (finished, None, "finished", ClaimStatus.FINISHED),
        (running, None, "busy", ClaimStatus.BUSY),
        (blocked, None, "blocked", ClaimStatus.BLOCKED),
    ]
    for turn_id, session_id, why, status in cases:
        before = None if status is ClaimStatus.NOT_FOUND else _row(turn_id)
        assert _why(turn_id, session_id) == why
        given = {"session_id" if claim is claim_turn else "expected_session": session_id}
        result = claim(turn_id, worker="x@host-b", **given, engine=get_engine(), settings=get_settings())
        assert result.status is status and result.claim is None
        if before is not None:
            assert _row(turn_id) == before, f"{status} wrote to the turn"
        if status is ClaimStatus.BUSY:
            assert result.retry_after is not None and 0 < result.retry_after <= get_settings().lease_seconds
        if status is ClaimStatus.CONFLICT:
            assert result.error is not None and f"not in session {other}" in result.error


@pytest.mark.parametrize("claim", CLAIMERS)
@pytest.mark.parametrize("how", ["claim", "sweep"])
def test_a_cancel_pending_when_the_worker_stopped_ends_the_turn_at_claim(claim: Claimer, how: str) -> None:
    dead = _node("dead")
    turn_id = _claimed(_session(), worker=dead)
    with session_scope() as db:
        assert request_cancel(db, [turn_id]) == {turn_id: TurnStatus.RUNNING}
    _stop(turn_id)
    if how == "sweep":
        _, expired = stale_turns(
            grace_seconds=3600, engine=get_engine(), renewal_interval=get_settings().renewal_interval
        )
        assert turn_id in expired
        assert _why(turn_id) == "cancel_pending"
    else:
        assert _why(turn_id) == "stopped"
    result = claim(turn_id, worker="x@host-b", engine=get_engine(), settings=get_settings())
    assert (result.status, result.attempt, result.claim) == (ClaimStatus.CANCELLED, 1, None)
    row = _row(turn_id)
    assert (row["status"], row["lease_token"], row["lease_expires_at"]) == (TurnStatus.CANCELLED, None, None)
    assert row["finished_at"] is not None and row["deliveries"] == 1
    # The take-over recorded the stop before the turn moved on.
    assert row["stopped_worker"] == dead
    assert _why(turn_id) == "finished"


@pytest.mark.parametrize("claim", CLAIMERS)
def test_a_turn_taken_over_at_claim_carries_its_whole_session(claim: Claimer) -> None:
    """Every claim is the claim statement's: the session's knowledge bases come with a take-over too."""
    kb = f"why-{uuid.uuid4().hex[:8]}"
    create_knowledge_base(kb)
    sid = _session(system_prompt="be brief", metadata={"team": "a"}, knowledge_bases=[kb])
    turn_id = _claimed(sid, worker=_node("dead"))
    _stop(turn_id)
    result = claim(turn_id, worker="x@host-b", engine=get_engine(), settings=get_settings())
    assert result.status is ClaimStatus.CLAIMED and result.claim is not None
    session = result.claim.session
    assert session == ClaimedSession(
        id=sid,
        agent_framework="none",
        model="echo",
        system_prompt="be brief",
        metadata={"team": "a"},
        knowledge_bases=(kb,),
    )
    # The runner hands the handler its own type, made of the store's.
    info = handler_session(session)
    assert (info.id, info.system_prompt, info.metadata_, info.knowledge_bases) == (
        sid,
        "be brief",
        {"team": "a"},
        (kb,),
    )
    assert (result.claim.attempt, result.claim.deliveries) == (2, 2)


def test_a_take_over_decided_on_a_lease_since_renewed_or_taken_changes_nothing() -> None:
    """Two deliveries saw the same stopped turn; the first took it over and claimed it (a live lease
    again). The second's take-over, decided on what it read before, records no stop and releases nothing."""
    dead = _node("dead")
    turn_id = _claimed(_session(), worker=dead)
    _stop(turn_id)
    assert (
        claim_turn(turn_id, worker="first@host-b", engine=get_engine(), settings=get_settings()).status
        is ClaimStatus.CLAIMED
    )
    before = _row(turn_id)
    with session_scope() as db:
        assert take_over(db, [turn_id], renewal_interval=get_settings().renewal_interval) == []
    assert _row(turn_id) == before
    assert (before["stopped_worker"], before["lone_crashes"], before["deliveries"]) == (dead, 1, 2)


@pytest.mark.parametrize("claim", CLAIMERS)
def test_a_poison_turn_ends_failed_at_claim_for_the_counts_it_was_decided_on(claim: Claimer) -> None:
    max_deliveries = get_settings().max_deliveries
    turn_id = submit_turn(_session(), "hello").turn_id
    with session_scope() as db:
        db.execute(
            update(Turn).where(Turn.id == turn_id).values(deliveries=max_deliveries, lone_crashes=max_deliveries)
        )
    assert _why(turn_id) == "poison"
    # Counts other than those the reason was written for: the statement leaves the turn alone.
    params = {"turn_id": turn_id, "error": "stale", "max_deliveries": max_deliveries}
    counts = {"deliveries": max_deliveries - 1, "lone_crashes": max_deliveries, "hosts": 0}
    with session_scope() as db:
        assert db.execute(sql.POISON_AT_CLAIM, {**params, **counts}).first() is None
    result = claim(turn_id, worker="x@host-b", engine=get_engine(), settings=get_settings())
    assert result.status is ClaimStatus.POISONED and result.attempt == 0
    row = _row(turn_id)
    assert (row["status"], row["error"], row["deliveries"]) == (TurnStatus.FAILED, result.error, max_deliveries)
    assert "the only turn running each of the" in (result.error or "")

"""worker/store/claims.py against the real Postgres, no worker: claims and the writes that end turns."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, text, update

from chatq.settings import get_settings
from handlers.base import AgentMessage
from models.db import autocommit_scope, get_engine, session_scope
from models.tables import Turn, TurnStatus
from worker.producer import create_session, submit_turn
from worker.store.claims import ClaimStatus, claim_turn, complete_turn, finish_turn
from worker.store.transition_sql import FAST_CLAIM
from worker.store.turns import recount_history_totals

pytestmark = pytest.mark.usefixtures("chatq_env")


def test_a_claim_takes_the_turn_and_carries_what_the_handler_needs() -> None:
    sid = create_session(framework="none", model="echo", system_prompt="be brief")
    turn_id = submit_turn(sid, "hello").turn_id
    result = claim_turn(turn_id, worker="w1", engine=get_engine(), settings=get_settings())
    assert result.status is ClaimStatus.CLAIMED and result.claim is not None
    claim = result.claim
    assert (claim.content, claim.attempt, claim.deliveries) == ("hello", 1, 1)
    assert claim.session.system_prompt == "be brief"
    with session_scope() as db:
        turn = db.get(Turn, turn_id)
        assert turn is not None and turn.status is TurnStatus.RUNNING and turn.lease_token == claim.lease_token
    # The turn is taken: a second claim (a duplicate delivery) gets nothing while the lease holds.
    assert claim_turn(turn_id, worker="w2", engine=get_engine(), settings=get_settings()).claim is None


def test_only_the_claim_statement_commits_without_waiting_for_the_wal_flush() -> None:
    sid = create_session(framework="none", model="echo")
    turn_id = submit_turn(sid, "hello").turn_id
    engine = get_engine()
    with engine.connect() as connection, connection.begin() as transaction:
        params = {"turn_id": turn_id, "token": turn_id, "lease_seconds": 30, "worker": "w", "max_deliveries": 5}
        assert connection.execute(FAST_CLAIM, params).one_or_none() is not None
        assert connection.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
        transaction.rollback()
    # In autocommit (how claim_turn runs it) the setting ends with the statement: the pooled
    # connection it used commits durably again.
    assert claim_turn(turn_id, worker="w", engine=get_engine(), settings=get_settings()).status is ClaimStatus.CLAIMED
    for _ in range(engine.pool.size() + 1):
        with autocommit_scope() as db:
            assert db.execute(text("SHOW synchronous_commit")).scalar_one() == "on"


def _totals(session_id: uuid.UUID) -> list[tuple[int, str, int | None, int | None]]:
    with session_scope() as db:
        rows = db.execute(
            select(Turn.position, Turn.status, Turn.history_turns, Turn.history_messages)
            .where(Turn.session_id == session_id)
            .order_by(Turn.position)
        ).all()
    return [(p, s.value, t, m) for p, s, t, m in rows]


def _run(turn_id: uuid.UUID, reply: list[AgentMessage] | None) -> None:
    claim = claim_turn(turn_id, worker="w", engine=get_engine(), settings=get_settings()).claim
    assert claim is not None
    if reply is None:
        assert finish_turn(claim, TurnStatus.FAILED, "boom", engine=get_engine()).stored
    else:
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        assert complete_turn(claim, reply, usage, engine=get_engine()).stored


def test_each_succeeded_turn_keeps_the_sessions_running_history_totals() -> None:
    sid = create_session(framework="none", model="echo")
    call = {"id": "c1", "name": "calculator", "args": {"expression": "6*7"}}
    replies: list[list[AgentMessage] | None] = [
        [AgentMessage(role="assistant", content="one")],
        None,  # failed: not history, and not counted
        [
            AgentMessage(role="assistant", content="", tool_calls=[call]),
            AgentMessage(role="tool", content="42", tool_call_id="c1"),
            AgentMessage(role="assistant", content="42"),
        ],
        [AgentMessage(role="assistant", content="four")],
    ]
    for n, reply in enumerate(replies):
        _run(submit_turn(sid, f"turn {n}").turn_id, reply)
    assert _totals(sid) == [
        (0, "succeeded", 1, 2),
        (1, "failed", None, None),
        (2, "succeeded", 2, 6),
        (3, "succeeded", 3, 8),
    ]
    # The same as counting the rows.
    with session_scope() as db:
        recount_history_totals(db, sid)
    assert [row[2:] for row in _totals(sid)] == [(1, 2), (None, None), (2, 6), (3, 8)]


def test_totals_missing_before_a_turn_are_counted_when_it_succeeds() -> None:
    """A turn stored by a chatq older than the totals (none kept) does not break the chain."""
    sid = create_session(framework="none", model="echo")
    for n in range(2):
        _run(submit_turn(sid, f"turn {n}").turn_id, [AgentMessage(role="assistant", content=f"reply {n}")])
    with session_scope() as db:
        db.execute(update(Turn).where(Turn.session_id == sid).values(history_turns=None, history_messages=None))
    _run(submit_turn(sid, "turn 2").turn_id, [AgentMessage(role="assistant", content="reply 2")])
    assert _totals(sid)[-1] == (2, "succeeded", 3, 6)

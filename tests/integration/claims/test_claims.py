"""worker/claims.py's fast claim against the real Postgres, no worker (nothing here consumes messages)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from models.db import autocommit_scope, get_engine, session_scope
from models.tables import Turn, TurnStatus
from worker.claims import _FAST_CLAIM, ClaimStatus, claim_turn
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.usefixtures("chatq_env")


def test_a_claim_takes_the_turn_and_carries_what_the_handler_needs() -> None:
    sid = create_session(framework="none", model="echo", system_prompt="be brief")
    turn_id = submit_turn(sid, "hello").turn_id
    result = claim_turn(turn_id, worker="w1")
    assert result.status is ClaimStatus.CLAIMED and result.claim is not None
    claim = result.claim
    assert (claim.content, claim.attempt, claim.deliveries) == ("hello", 1, 1)
    assert claim.session.system_prompt == "be brief"
    with session_scope() as db:
        turn = db.get(Turn, turn_id)
        assert turn is not None and turn.status is TurnStatus.RUNNING and turn.lease_token == claim.lease_token
    # The turn is taken: a second claim (a duplicate delivery) gets nothing while the lease holds.
    assert claim_turn(turn_id, worker="w2").claim is None


def test_only_the_claim_statement_commits_without_waiting_for_the_wal_flush() -> None:
    sid = create_session(framework="none", model="echo")
    turn_id = submit_turn(sid, "hello").turn_id
    engine = get_engine()
    with engine.connect() as connection, connection.begin() as transaction:
        params = {"turn_id": turn_id, "token": turn_id, "lease_seconds": 30, "worker": "w", "max_deliveries": 5}
        assert connection.execute(_FAST_CLAIM, params).one_or_none() is not None
        assert connection.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
        transaction.rollback()
    # In autocommit (how claim_turn runs it) the setting ends with the statement: the pooled
    # connection it used commits durably again.
    assert claim_turn(turn_id, worker="w").status is ClaimStatus.CLAIMED
    for _ in range(engine.pool.size() + 1):
        with autocommit_scope() as db:
            assert db.execute(text("SHOW synchronous_commit")).scalar_one() == "on"

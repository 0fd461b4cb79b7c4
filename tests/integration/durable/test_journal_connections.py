"""Opening a turn's journal costs a turn little (issue 32, "A lean turn"): no read when the claim saw no steps, and
no discarded prepared statements when it reads.

psycopg prepares a statement on a connection after a few executions and deallocates every one of
them when a transaction is rolled back; a read left in a transaction is rolled back when its
connection returns to the pool. Each turn would then prepare its claim, reply and journal
statements again.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from sqlalchemy import create_engine, text

from chatq.settings import get_settings
from models.db import get_engine
from tests.support.inprocess import build_runtime
from worker.producer import create_session, submit_turn
from worker.runtime.delivery.resume import open_journal
from worker.store.claims import claim_turn, requeue_turn
from worker.store.journal import TurnJournal

PREPARED = text("SELECT count(*) FROM pg_prepared_statements")


def test_opening_a_journal_keeps_the_connections_prepared_statements(chatq_env: dict[str, str]) -> None:
    # One pooled connection, so the journal reads on the connection that prepared the statement.
    engine = create_engine(chatq_env["DATABASE_URL"], pool_size=1, max_overflow=0)
    try:
        with engine.connect() as db:
            db = db.execution_options(isolation_level="AUTOCOMMIT")
            pid = db.execute(text("SELECT pg_backend_pid()")).scalar_one()
            for _ in range(8):  # past psycopg's prepare threshold (5)
                db.execute(text("SELECT 1 WHERE 1 = :one"), {"one": 1})
            assert db.execute(PREPARED).scalar_one() >= 1
        turn_id = uuid.uuid4()
        journal = TurnJournal.open(engine, turn_id=turn_id, lease_token=uuid.uuid4(), attempt=1)
        assert journal.done == ()
        with engine.connect() as db:
            assert db.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
            assert db.execute(PREPARED).scalar_one() >= 1, "the journal's read discarded the prepared statements"
    finally:
        engine.dispose()


def test_a_claim_says_whether_earlier_attempts_left_steps_and_only_then_is_the_journal_read(
    chatq_env: dict[str, str],
) -> None:
    engine, settings = get_engine(), get_settings()
    turn_id = submit_turn(create_session(framework="none", model="echo"), "hello").turn_id
    first = claim_turn(turn_id, worker="w1", engine=engine, settings=settings).claim
    assert first is not None and not first.has_steps
    journal = open_journal(first, build_runtime())
    assert journal.done == ()
    journal.tool_started("call-1", "lookup")
    assert requeue_turn(first, engine=engine, hand_back=True)
    second = claim_turn(turn_id, worker="w2", engine=engine, settings=settings).claim
    assert second is not None and second.has_steps
    assert [step.call_id for step in open_journal(second, build_runtime()).done] == ["call-1"]
    # A claim that saw no steps skips the read: a step written after it is not in its journal.
    with_step_unseen = replace(second, has_steps=False)
    assert open_journal(with_step_unseen, build_runtime()).done == ()

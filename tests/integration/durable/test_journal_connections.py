"""Opening a turn's journal keeps the pooled connection's prepared statements (issue 32, "A lean turn").

psycopg prepares a statement on a connection after a few executions and deallocates every one of
them when a transaction is rolled back; a read left in a transaction is rolled back when its
connection returns to the pool. Each turn would then prepare its claim, reply and journal
statements again.
"""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text

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

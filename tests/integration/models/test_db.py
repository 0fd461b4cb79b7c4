"""models/db.py against the real Postgres: pooled connections a server dropped are never handed out."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from models.db import autocommit_scope, connection_scope, get_engine

pytestmark = pytest.mark.usefixtures("chatq_env")


def test_a_connection_the_server_closed_moments_ago_is_replaced_at_checkout() -> None:
    engine = get_engine()
    engine.dispose()
    with engine.connect() as doomed:
        doomed_pid = doomed.execute(text("SELECT pg_backend_pid()")).scalar_one()
        doomed.commit()
    # Back in the pool, the only one there. As a restart or an administrator would, from a
    # connection outside the pool:
    outsider = create_engine(engine.url, poolclass=NullPool)
    with outsider.connect() as other:
        # pg_terminate_backend only signals; wait (up to 5 s) until the backend has gone and so has
        # closed its socket, or the checkout below can still find a live connection.
        assert other.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": doomed_pid}).scalar_one()
        other.commit()
    outsider.dispose()
    for _ in range(3):
        # Checked in well within the no-ping window: only the socket tells that the server hung up.
        with connection_scope() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != doomed_pid


def test_autocommit_scope_commits_each_statement_on_its_own() -> None:
    with autocommit_scope() as conn:
        conn.execute(text("CREATE TEMP TABLE probe (n int)"))
        conn.execute(text("INSERT INTO probe VALUES (1)"))
        with pytest.raises(Exception, match="division by zero"):
            conn.execute(text("INSERT INTO probe VALUES (1 / 0)"))
        # The failed statement took nothing else with it: no transaction was open.
        assert conn.execute(text("SELECT count(*) FROM probe")).scalar_one() == 1
        conn.execute(text("DROP TABLE probe"))

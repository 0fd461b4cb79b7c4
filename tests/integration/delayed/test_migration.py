"""Migration 0013 down with delayed turns stored: an older chatq cannot keep them, so each ends
`cancelled` with a position after its session's others (the column is NOT NULL again)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, pool, text

from models.migrate import downgrade, upgrade
from tests.support.services import fresh_database


@pytest.fixture
def blank_engine() -> Iterator[Engine]:
    """An engine on a database of its own that no migration has touched."""
    with fresh_database("chatq_migrate", migrate=False) as url:
        engine = create_engine(url, poolclass=pool.NullPool)
        try:
            yield engine
        finally:
            engine.dispose()


def test_downgrade_cancels_delayed_turns_and_gives_them_positions(blank_engine: Engine) -> None:
    url = blank_engine.url.render_as_string(hide_password=False)
    upgrade(url)
    session_id, queued, later, latest = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with blank_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO chat_sessions (id, agent_framework, metadata, next_turn_position)"
                " VALUES (:id, 'none', '{}', 1)"
            ),
            {"id": session_id},
        )
        conn.execute(
            text("INSERT INTO turns (id, session_id, position, status) VALUES (:id, :sid, 0, 'queued')"),
            {"id": queued, "sid": session_id},
        )
        for turn_id, hours in ((latest, 2), (later, 1)):
            conn.execute(
                text(
                    "INSERT INTO turns (id, session_id, position, status, run_at, pending_input)"
                    " VALUES (:id, :sid, NULL, 'delayed', now() + make_interval(hours => :h), '{\"content\": \"x\"}')"
                ),
                {"id": turn_id, "sid": session_id, "h": hours},
            )
    downgrade(url, revision="0012")
    with blank_engine.connect() as conn:
        rows = {
            row.id: (row.position, row.status) for row in conn.execute(text("SELECT id, position, status FROM turns"))
        }
        next_position = conn.execute(text("SELECT next_turn_position FROM chat_sessions")).scalar_one()
    assert rows == {queued: (0, "queued"), later: (1, "cancelled"), latest: (2, "cancelled")}
    assert next_position == 3
    upgrade(url)

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, delete, func, inspect, pool, select, text
from sqlalchemy.exc import IntegrityError

from models.db import session_scope
from models.migrate import downgrade, upgrade
from models.tables import MESSAGE_POSITION_STRIDE, Base, ChatMessage, ChatSession, Turn, TurnStatus
from tests.support.env import environ
from tests.support.factories import add_turn, assistant, create_session, user
from tests.support.services import fresh_database

TABLES = {"chat_sessions", "turns", "chat_messages"}

# The public columns docs/contract.md ("Data") names; tables may have more.
SPEC_COLUMNS = {
    "chat_sessions": {"id", "agent_framework", "model", "system_prompt", "metadata", "created_at"},
    "turns": {
        "id",
        "session_id",
        "position",
        "status",
        "attempts",
        "error",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "created_at",
        "started_at",
        "finished_at",
    },
    "chat_messages": {
        "id",
        "session_id",
        "turn_id",
        "position",
        "role",
        "content",
        "tool_calls",
        "tool_call_id",
        "images",
        "created_at",
    },
}


@pytest.fixture
def blank_engine() -> Iterator[Engine]:
    """An engine on a database of its own that no migration has touched."""
    with fresh_database("chatq_migrate", migrate=False) as url:
        engine = create_engine(url, poolclass=pool.NullPool)
        try:
            yield engine
        finally:
            engine.dispose()


def test_migrations_go_up_down_and_up_again(blank_engine: Engine) -> None:
    url = blank_engine.url.render_as_string(hide_password=False)
    assert not TABLES & set(inspect(blank_engine).get_table_names())

    upgrade(url)
    inspector = inspect(blank_engine)
    assert set(inspector.get_table_names()) >= TABLES
    for table, columns in SPEC_COLUMNS.items():
        found = {c["name"]: c for c in inspector.get_columns(table)}
        assert columns <= set(found), f"{table} lacks {columns - set(found)}"
    types = {
        (t, c["name"]): str(c["type"]).upper()
        for t in TABLES
        for c in inspector.get_columns(t)
        if c["name"] in {"id", "session_id", "turn_id", "metadata", "tool_calls", "images"}
    }
    assert types[("chat_sessions", "id")] == "UUID"
    assert types[("turns", "id")] == "UUID"
    assert types[("chat_messages", "session_id")] == "UUID"
    assert {types[("chat_sessions", "metadata")], types[("chat_messages", "tool_calls")]} == {"JSONB"}
    assert types[("chat_messages", "images")] == "JSONB"

    downgrade(url)
    assert not TABLES & set(inspect(blank_engine).get_table_names())

    upgrade(url)
    assert set(inspect(blank_engine).get_table_names()) >= TABLES


def test_the_migrations_match_the_models(blank_engine: Engine) -> None:
    upgrade(blank_engine.url.render_as_string(hide_password=False))
    with blank_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_migration_0003_fills_in_the_history_totals_of_existing_turns(blank_engine: Engine) -> None:
    url = blank_engine.url.render_as_string(hide_password=False)
    upgrade(url, revision="0002")
    sid = uuid.uuid4()
    statuses = ["succeeded", "failed", "succeeded", "succeeded", "queued"]
    messages = [2, 1, 4, 2, 1]  # a tool turn at position 2; the failed and queued turns hold their user message
    with blank_engine.begin() as conn:
        conn.execute(
            text("INSERT INTO chat_sessions (id, agent_framework, model, metadata) VALUES (:id, 'none', 'echo', '{}')"),
            {"id": sid},
        )
        for position, (status, count) in enumerate(zip(statuses, messages, strict=True)):
            turn_id = uuid.uuid4()
            conn.execute(
                text("INSERT INTO turns (id, session_id, position, status) VALUES (:id, :sid, :position, :status)"),
                {"id": turn_id, "sid": sid, "position": position, "status": status},
            )
            for offset in range(count):
                conn.execute(
                    text(
                        "INSERT INTO chat_messages (session_id, turn_id, position, role, content) "
                        "VALUES (:sid, :turn_id, :position, :role, 'x')"
                    ),
                    {
                        "sid": sid,
                        "turn_id": turn_id,
                        "position": position * MESSAGE_POSITION_STRIDE + offset,
                        "role": "user" if offset == 0 else "assistant",
                    },
                )
    upgrade(url)
    with blank_engine.connect() as conn:
        rows = conn.execute(
            text("SELECT history_turns, history_messages FROM turns WHERE session_id = :sid ORDER BY position"),
            {"sid": sid},
        ).all()
    assert [tuple(row) for row in rows] == [(1, 2), (None, None), (2, 6), (3, 8), (None, None)]


def test_migration_0005_lets_a_session_leave_its_model_to_the_worker(blank_engine: Engine) -> None:
    url = blank_engine.url.render_as_string(hide_password=False)
    upgrade(url, revision="0004")
    insert = text("INSERT INTO chat_sessions (id, agent_framework, model, metadata) VALUES (:id, 'none', :model, '{}')")
    kept, unnamed = uuid.uuid4(), uuid.uuid4()
    with blank_engine.begin() as conn:
        conn.execute(insert, {"id": kept, "model": "gpt-4o"})
        with pytest.raises(IntegrityError), conn.begin_nested():
            conn.execute(insert, {"id": unnamed, "model": None})
    upgrade(url)
    with blank_engine.begin() as conn:
        conn.execute(insert, {"id": unnamed, "model": None})
    # The old schema needs a name: the downgrade writes the default model it is handed (`chatq db`
    # hands in its settings') ...
    downgrade(url, revision="0004", default_model="the-model-handed-in")
    with blank_engine.connect() as conn:
        models = {row.id: row.model for row in conn.execute(text("SELECT id, model FROM chat_sessions"))}
    assert models == {kept: "gpt-4o", unnamed: "the-model-handed-in"}
    # ... or, given none (`alembic` from a shell), the default of the environment running it.
    upgrade(url)
    with blank_engine.begin() as conn:
        conn.execute(text("UPDATE chat_sessions SET model = NULL WHERE id = :id"), {"id": unnamed})
    with environ(CHATQ_MODEL="the-default-at-downgrade"):
        downgrade(url, revision="0004")
    with blank_engine.connect() as conn:
        models = {row.id: row.model for row in conn.execute(text("SELECT id, model FROM chat_sessions"))}
    assert models == {kept: "gpt-4o", unnamed: "the-default-at-downgrade"}


@pytest.mark.usefixtures("chatq_env")
def test_the_status_check_constraint_rejects_unknown_statuses() -> None:
    sid = create_session()
    with pytest.raises(IntegrityError, match="ck_turns_turn_status"), session_scope() as db:
        db.execute(
            text("INSERT INTO turns (id, session_id, position, status) VALUES (:id, :sid, 0, 'exploded')"),
            {"id": uuid.uuid4(), "sid": sid},
        )
    for status in TurnStatus:
        add_turn(sid, [user(status.value)], status=status)


@pytest.mark.usefixtures("chatq_env")
def test_turn_positions_are_unique_within_a_session() -> None:
    sid = create_session()
    first = add_turn(sid, [user("first")])
    with pytest.raises(IntegrityError, match="uq_turns_session_position"), session_scope() as db:
        db.add(Turn(id=uuid.uuid4(), session_id=sid, position=first.position, status=TurnStatus.QUEUED))
    # The same position in another session is fine.
    other = create_session()
    with session_scope() as db:
        db.add(Turn(id=uuid.uuid4(), session_id=other, position=first.position, status=TurnStatus.QUEUED))


@pytest.mark.usefixtures("chatq_env")
def test_message_positions_are_unique_within_a_session() -> None:
    sid = create_session()
    turn = add_turn(sid, [user("hello")])
    position = turn.position * MESSAGE_POSITION_STRIDE
    with pytest.raises(IntegrityError, match="uq_chat_messages_session_position"), session_scope() as db:
        db.add(ChatMessage(session_id=sid, turn_id=turn.id, position=position, role="assistant", content="dup"))


@pytest.mark.usefixtures("chatq_env")
def test_deleting_a_session_deletes_its_turns_and_messages() -> None:
    sid = create_session()
    add_turn(sid, [user("hi"), assistant("hello")])
    add_turn(sid, [user("again")], status=TurnStatus.QUEUED)
    keep = create_session()
    add_turn(keep, [user("unrelated"), assistant("stays")])

    with session_scope() as db:
        db.execute(delete(ChatSession).where(ChatSession.id == sid))

    with session_scope() as db:
        for model in (Turn, ChatMessage):
            assert db.scalar(select(func.count()).select_from(model).where(model.session_id == sid)) == 0
        assert db.scalar(select(func.count()).select_from(ChatMessage).where(ChatMessage.session_id == keep)) == 2


@pytest.mark.usefixtures("chatq_env")
def test_the_partial_index_of_active_turns_exists() -> None:
    with session_scope() as db:
        definition = db.scalar(
            text(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'turns' AND indexname = 'ix_turns_active_by_session'"
            )
        )
    assert definition is not None
    assert '(session_id, "position")' in definition
    assert "WHERE" in definition
    assert "'queued'" in definition
    assert "'running'" in definition

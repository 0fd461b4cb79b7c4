"""`submit_turn` against the real Postgres and Redis, no worker: what it stores, and what it refuses.

No worker consumes this package's messages, so every row is exactly as `submit_turn` left it.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus
from worker.errors import InvalidTurn, SessionBusy, SessionNotFound, TurnConflict
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.usefixtures("chatq_env")

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def _rows(session_id: uuid.UUID) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]], int]:
    """(turns as (position, status), messages as (position, role, content), next_turn_position)."""
    with session_scope() as db:
        turns = [
            (t.position, t.status.value)
            for t in db.execute(select(Turn).where(Turn.session_id == session_id).order_by(Turn.position)).scalars()
        ]
        messages = [
            (m.position, m.role, m.content)
            for m in db.execute(
                select(ChatMessage).where(ChatMessage.session_id == session_id).order_by(ChatMessage.position)
            ).scalars()
        ]
        next_position = db.execute(
            select(ChatSession.next_turn_position).where(ChatSession.id == session_id)
        ).scalar_one()
    return turns, messages, next_position


def test_turns_take_consecutive_positions_with_their_user_message() -> None:
    sid = create_session(framework="none", model="echo")
    first = submit_turn(sid, "one")
    second = submit_turn(sid, "two", images=[IMAGE])
    assert (first.position, second.position) == (0, 1)
    assert first.created and second.created
    turns, messages, next_position = _rows(sid)
    assert turns == [(0, "queued"), (1, "queued")]
    assert messages == [(0, "user", "one"), (MESSAGE_POSITION_STRIDE, "user", "two")]
    assert next_position == 2
    with session_scope() as db:
        images = db.execute(select(ChatMessage.images).where(ChatMessage.turn_id == second.turn_id)).scalar_one()
        row = db.get(Turn, second.turn_id)
        assert row is not None and row.queue == "chatq" and row.attempts == 0 and row.reply_to is None
    assert images == [IMAGE]


def test_an_unknown_session_is_refused_and_nothing_is_stored() -> None:
    missing = uuid.uuid4()
    with pytest.raises(SessionNotFound, match=str(missing)):
        submit_turn(missing, "hello")
    with session_scope() as db:
        assert db.execute(select(func.count()).select_from(Turn).where(Turn.session_id == missing)).scalar_one() == 0


def test_the_same_turn_id_again_is_idempotent_and_takes_no_position() -> None:
    sid = create_session(framework="none", model="echo")
    turn_id = uuid.uuid4()
    first = submit_turn(sid, "hello", turn_id=turn_id)
    again = submit_turn(sid, "hello", turn_id=turn_id)
    assert first.created and not again.created and not again.sent
    assert again.position == first.position == 0
    following = submit_turn(sid, "next")
    assert following.position == 1, "a resubmission must not use up a position"
    turns, messages, _ = _rows(sid)
    assert turns == [(0, "queued"), (1, "queued")]
    assert [m[2] for m in messages] == ["hello", "next"]


def test_the_same_turn_id_with_other_content_or_session_conflicts() -> None:
    sid = create_session(framework="none", model="echo")
    other = create_session(framework="none", model="echo")
    turn_id = uuid.uuid4()
    submit_turn(sid, "hello", turn_id=turn_id)
    # One answer whatever differs: it names no session (a tenant must learn nothing of another's turn).
    conflicts = []
    for session, content in ((sid, "something else"), (other, "hello"), (other, "something else")):
        with pytest.raises(TurnConflict) as info:
            submit_turn(session, content, turn_id=turn_id)
        conflicts.append(info.value.message)
    assert set(conflicts) == {f"turn {turn_id} already exists: a turn id names one turn; use a new id"}
    assert _rows(other) == ([], [], 0)
    assert _rows(sid)[2] == 1


def test_reply_to_must_be_a_user_message_of_the_same_session() -> None:
    sid = create_session(framework="none", model="echo")
    first = submit_turn(sid, "question")
    with session_scope() as db:
        user_message_id = db.execute(select(ChatMessage.id).where(ChatMessage.turn_id == first.turn_id)).scalar_one()
    regenerated = submit_turn(sid, "question", reply_to=user_message_id)
    with session_scope() as db:
        row = db.get(Turn, regenerated.turn_id)
        assert row is not None and row.reply_to == user_message_id
    other = create_session(framework="none", model="echo")
    with pytest.raises(InvalidTurn, match="is not a message of session"):
        submit_turn(other, "question", reply_to=user_message_id)
    assert _rows(other) == ([], [], 0)


def test_a_batch_queue_turn_is_stored_on_that_queue() -> None:
    sid = create_session(framework="none", model="echo")
    submitted = submit_turn(sid, "later", queue="chatq.batch")
    with session_scope() as db:
        row = db.get(Turn, submitted.turn_id)
        assert row is not None and row.queue == "chatq.batch" and row.status is TurnStatus.QUEUED


def test_if_busy_reject_stores_nothing_and_interrupt_cancels_the_queued_turns() -> None:
    sid = create_session(framework="none", model="echo")
    waiting = submit_turn(sid, "first")
    with pytest.raises(SessionBusy):
        submit_turn(sid, "me too", if_busy="reject")
    assert _rows(sid) == ([(0, "queued")], [(0, "user", "first")], 1)
    replacement = submit_turn(sid, "instead", if_busy="interrupt")
    assert replacement.cancelled == [waiting.turn_id]
    assert replacement.position == 1
    turns, messages, next_position = _rows(sid)
    assert turns == [(0, "cancelled"), (1, "queued")]
    assert [m[2] for m in messages] == ["first", "instead"]
    assert next_position == 2


def test_if_busy_on_an_unknown_session_is_refused() -> None:
    with pytest.raises(SessionNotFound):
        submit_turn(uuid.uuid4(), "hello", if_busy="interrupt")


def _session_count() -> int:
    with session_scope() as db:
        return int(db.execute(select(func.count()).select_from(ChatSession)).scalar_one())


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"content": "caf\udce9"}, "content contains a lone surrogate (U+DCE9) at position 3"),
        ({"content": "a\x00"}, "content contains a NUL character (U+0000) at position 1"),
        ({"reply_to": 2**63}, "reply_to must be a message id from 1 to 9223372036854775807"),
        ({"images": ["https://example.test/\x00"]}, "images[0] contains a NUL character"),
    ],
)
def test_turns_postgres_cannot_store_are_refused_naming_the_field(fields: dict[str, object], fragment: str) -> None:
    sid = create_session(framework="none", model="echo")
    arguments: dict[str, object] = {"content": "hello", **fields}
    content = str(arguments.pop("content"))
    with pytest.raises(InvalidTurn) as info:
        submit_turn(sid, content, **arguments)  # type: ignore[arg-type]
    assert fragment in info.value.message
    assert _rows(sid) == ([], [], 0)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"model": "gpt\x00"}, "model contains a NUL character"),
        ({"system_prompt": "\ud800"}, "system_prompt contains a lone surrogate"),
        ({"metadata": {"note": "a\x00"}}, "metadata has a NUL character (U+0000) at position 1 in the value at note"),
        ({"metadata": {"score": float("inf")}}, "metadata has inf at score, which JSON cannot hold"),
        ({"metadata": {"when": object()}}, "metadata has a object at when, which is not a JSON value"),
    ],
)
def test_sessions_postgres_cannot_store_are_refused_naming_the_field(fields: dict[str, object], fragment: str) -> None:
    before = _session_count()
    with pytest.raises(InvalidTurn) as info:
        create_session(framework="none", **fields)  # type: ignore[arg-type]
    assert fragment in info.value.message
    assert _session_count() == before

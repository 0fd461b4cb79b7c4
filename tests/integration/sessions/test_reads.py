"""Reading and changing sessions without a worker: get, list (pages, filters, tenants), update, turn pages."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from models.db import session_scope
from models.errors import KnowledgeBaseNotFound
from models.knowledge import create_knowledge_base
from models.tables import ChatSession
from worker.errors import InvalidCursor, InvalidTurn, SessionNotFound
from worker.producer import (
    create_session,
    get_session,
    list_sessions,
    list_turns,
    submit_turn,
    update_session,
)

pytestmark = pytest.mark.usefixtures("chatq_env")


def _label() -> str:
    return uuid.uuid4().hex


def test_get_session_shows_what_was_created() -> None:
    sid = create_session(framework="none", model="echo", system_prompt="Be brief.", metadata={"user": "u1"})
    submit_turn(sid, "hi")
    found = get_session(sid)
    assert found["id"] == str(sid)
    assert (found["framework"], found["model"], found["system_prompt"]) == ("none", "echo", "Be brief.")
    assert found["metadata"] == {"user": "u1"} and found["knowledge_bases"] == [] and found["tenant"] is None
    assert found["turns"] == 1
    assert datetime.fromisoformat(found["last_active_at"]) >= datetime.fromisoformat(found["created_at"])
    with pytest.raises(SessionNotFound):
        get_session(uuid.uuid4())


def test_sessions_are_listed_newest_first_in_pages_that_new_sessions_do_not_shift() -> None:
    label = _label()
    created = [create_session(framework="none", metadata={"label": label, "n": str(n)}) for n in range(7)]
    first = list_sessions(limit=3, metadata={"label": label})
    assert [s["id"] for s in first.sessions] == [str(sid) for sid in reversed(created[-3:])]
    assert first.next_cursor is not None
    # Sessions created between two pages sort before the first page: the next page is not shifted.
    create_session(framework="none", metadata={"label": label})
    second = list_sessions(limit=3, metadata={"label": label}, cursor=first.next_cursor)
    assert [s["id"] for s in second.sessions] == [str(sid) for sid in reversed(created[1:4])]
    third = list_sessions(limit=3, metadata={"label": label}, cursor=second.next_cursor)
    assert [s["id"] for s in third.sessions] == [str(created[0])]
    assert third.next_cursor is None


def test_sessions_filter_by_metadata_and_creation_time() -> None:
    label = _label()
    a = create_session(framework="none", metadata={"label": label, "user": "ann"})
    b = create_session(framework="none", metadata={"label": label, "user": "bob"})
    only_bob = list_sessions(metadata={"label": label, "user": "bob"})
    assert [s["id"] for s in only_bob.sessions] == [str(b)]
    with session_scope() as db:
        a_created = db.execute(select(ChatSession.created_at).where(ChatSession.id == a)).scalar_one()
    after_a = list_sessions(metadata={"label": label}, created_after=a_created)
    assert [s["id"] for s in after_a.sessions] == [str(b)]
    before_b = list_sessions(metadata={"label": label}, created_before=a_created + timedelta(microseconds=1))
    assert [s["id"] for s in before_b.sessions] == [str(a)]
    future = list_sessions(metadata={"label": label}, created_after=datetime.now(UTC) + timedelta(days=1))
    assert future.sessions == [] and future.next_cursor is None


def test_a_tenant_sees_only_its_own_sessions() -> None:
    label = _label()
    mine = create_session(framework="none", metadata={"label": label}, tenant="acme")
    theirs = create_session(framework="none", metadata={"label": label}, tenant="globex")
    admins = create_session(framework="none", metadata={"label": label})
    assert [s["id"] for s in list_sessions(metadata={"label": label}, tenant="acme").sessions] == [str(mine)]
    everyone = {s["id"] for s in list_sessions(metadata={"label": label}).sessions}
    assert everyone == {str(mine), str(theirs), str(admins)}
    assert get_session(mine, tenant="acme")["tenant"] == "acme"
    for other in (theirs, admins):
        with pytest.raises(SessionNotFound):
            get_session(other, tenant="acme")
        with pytest.raises(SessionNotFound):
            update_session(other, model="echo", tenant="acme")
        with pytest.raises(SessionNotFound):
            list_turns(other, tenant="acme")


def test_bad_cursors_and_limits_are_refused_in_one_line() -> None:
    for cursor in ("nonsense", "dHwx", "", "cw"):
        with pytest.raises(InvalidCursor):
            list_sessions(cursor=cursor)
    sid = create_session(framework="none")
    page = list_sessions(limit=1)
    assert page.next_cursor is not None
    with pytest.raises(InvalidCursor):
        list_turns(sid, before=page.next_cursor)  # a session list's cursor is not a turn list's
    for limit in (0, -1, 1001):
        with pytest.raises(InvalidTurn, match="limit"):
            list_sessions(limit=limit)


def test_update_changes_what_is_given_and_keeps_the_rest() -> None:
    kb = f"kb-{_label()[:8]}"
    create_knowledge_base(kb)
    sid = create_session(framework="none", model="echo", system_prompt="old", metadata={"a": "1"})
    updated = update_session(sid, system_prompt="new", metadata={"b": 2}, knowledge_bases=[kb])
    assert (updated["system_prompt"], updated["model"]) == ("new", "echo")
    assert updated["metadata"] == {"b": 2} and updated["knowledge_bases"] == [kb]
    cleared = update_session(sid, model=None, system_prompt=None, knowledge_bases=[])
    assert (cleared["model"], cleared["system_prompt"], cleared["knowledge_bases"]) == (None, None, [])
    assert cleared["metadata"] == {"b": 2}
    with pytest.raises(KnowledgeBaseNotFound):
        update_session(sid, system_prompt="not stored", knowledge_bases=["no-such-kb"])
    assert get_session(sid)["system_prompt"] is None, "a failed update changes nothing"
    with pytest.raises(InvalidTurn, match="metadata"):
        update_session(sid, metadata=["not", "an", "object"])  # type: ignore[arg-type]


def test_turn_pages_go_back_from_the_newest_and_stay_put_while_turns_arrive() -> None:
    sid = create_session(framework="none")
    turns = [submit_turn(sid, f"message {n}").turn_id for n in range(5)]
    first = list_turns(sid, limit=2)
    assert [t["id"] for t in first.turns] == [str(turns[3]), str(turns[4])], "oldest first within the page"
    assert [t["messages"][0]["content"] for t in first.turns] == ["message 3", "message 4"]
    assert all(t["status"] == "queued" and t["messages"][0]["role"] == "user" for t in first.turns)
    submit_turn(sid, "arrives meanwhile")
    second = list_turns(sid, limit=2, before=first.next_cursor)
    assert [t["id"] for t in second.turns] == [str(turns[1]), str(turns[2])]
    third = list_turns(sid, limit=2, before=second.next_cursor)
    assert [t["id"] for t in third.turns] == [str(turns[0])] and third.next_cursor is None
    everything = list_turns(sid, limit=100)
    assert len(everything.turns) == 6 and everything.next_cursor is None
    assert list_turns(create_session(framework="none")).turns == []

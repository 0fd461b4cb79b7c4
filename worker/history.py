"""Reading sessions and their history: one session, pages of sessions, pages of a session's turns.

Pages are keyset pages (no OFFSET): a cursor names the last row handed out, and the next page
starts after it on an index (`ix_chat_sessions_created` / `ix_chat_sessions_tenant_created` for
sessions, newest first; `uq_turns_session_position` for turns, newest page first). A page is
therefore the same whatever is added meanwhile: new sessions and new turns sort before the first
page, never into a later one. Every read takes `tenant`: None reads every session (an admin),
a name only that tenant's (another tenant's session is "not found", so ids are not confirmed).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, select, tuple_
from sqlalchemy.orm import Session

from models.db import session_scope
from models.kb_names import same_tenant
from models.tables import (
    MESSAGE_POSITION_STRIDE,
    ChatMessage,
    ChatSession,
    KnowledgeBase,
    SessionKnowledgeBase,
    Turn,
)
from worker.errors import InvalidCursor, InvalidTurn, SessionNotFound
from worker.payload import parse_uuid

__all__ = [
    "MAX_PAGE",
    "SessionPage",
    "TurnPage",
    "get_session",
    "list_sessions",
    "list_turns",
    "message_dict",
    "scoped_session",
    "session_dict",
    "turn_dict",
]

MAX_PAGE = 1000
"""Most rows one page may hold."""


@dataclass(frozen=True, kw_only=True)
class SessionPage:
    """A page of sessions, newest first."""

    sessions: list[dict[str, Any]]
    """The sessions as `get_session` returns them."""
    next_cursor: str | None
    """Pass it as `cursor` for the next (older) page; None on the last page."""


@dataclass(frozen=True, kw_only=True)
class TurnPage:
    """A page of a session's turns: oldest first within the page, the newest page first."""

    turns: list[dict[str, Any]]
    """The turns as `turn_report` returns them (each with its messages)."""
    next_cursor: str | None
    """Pass it as `before` for the page of older turns; None when no older turn remains."""


def _encode(kind: str, *parts: str) -> str:
    raw = "|".join((kind, *parts)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(kind: str, cursor: str, count: int) -> list[str]:
    try:
        text = base64.urlsafe_b64decode(cursor.strip() + "=" * (-len(cursor.strip()) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidCursor(f"cursor {cursor[:60]!r} is not a cursor of this list") from None
    parts = text.split("|")
    if len(parts) != count + 1 or parts[0] != kind:
        raise InvalidCursor(f"cursor {cursor[:60]!r} is not a cursor of this list")
    return parts[1:]


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidTurn(f"limit must be a whole number from 1 to {MAX_PAGE}, got {limit!r}")
    return limit


def _knowledge_bases() -> Any:
    """The session's knowledge-base names, as a correlated ARRAY subquery."""
    names = (
        select(KnowledgeBase.name)
        .join(SessionKnowledgeBase, SessionKnowledgeBase.knowledge_base_id == KnowledgeBase.id)
        .where(SessionKnowledgeBase.session_id == ChatSession.id, same_tenant(ChatSession.tenant))
        .order_by(KnowledgeBase.name)
        .correlate(ChatSession)
        .scalar_subquery()
    )
    return func.array(names).label("knowledge_bases")


def _sessions(tenant: str | None) -> Select[Any]:
    query = select(ChatSession, _knowledge_bases())
    return query if tenant is None else query.where(ChatSession.tenant == tenant)


def session_dict(row: ChatSession, knowledge_bases: Sequence[str]) -> dict[str, Any]:
    """A session in the JSON form of `chatq session show --json` and `GET /sessions/{id}`."""
    return {
        "id": str(row.id),
        "framework": row.agent_framework,
        "model": row.model,
        "system_prompt": row.system_prompt,
        "metadata": row.metadata_ or {},
        "knowledge_bases": list(knowledge_bases),
        "webhook": row.webhook_url,
        "tenant": row.tenant,
        "turns": row.next_turn_position,
        "created_at": row.created_at.isoformat(),
        "last_active_at": row.last_active_at.isoformat(),
    }


def scoped_session(db: Session, session_id: uuid.UUID, tenant: str | None, *, lock: bool = False) -> ChatSession:
    """The session row if `tenant` may see it (None: any), else SessionNotFound (the same for both cases)."""
    query = select(ChatSession).where(ChatSession.id == session_id)
    if tenant is not None:
        query = query.where(ChatSession.tenant == tenant)
    if lock:
        query = query.with_for_update()
    row = db.execute(query).scalar_one_or_none()
    if row is None:
        raise SessionNotFound(f"session {session_id} does not exist")
    return row


def get_session(session_id: uuid.UUID | str, *, tenant: str | None = None) -> dict[str, Any]:
    """One session (`session_dict`); SessionNotFound if it does not exist or belongs to another tenant."""
    session_uuid = parse_uuid(str(session_id), "session_id")
    with session_scope() as db:
        query = _sessions(tenant).where(ChatSession.id == session_uuid)
        found = db.execute(query).one_or_none()
        if found is None:
            raise SessionNotFound(f"session {session_uuid} does not exist")
        return session_dict(found[0], found[1] or [])


def list_sessions(
    *,
    limit: int = 20,
    cursor: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    tenant: str | None = None,
) -> SessionPage:
    """Sessions newest first, a page at a time.

    `metadata` keeps the sessions whose metadata holds every given key with that value (JSON
    containment: a string matches a string); `created_after` / `created_before` bound the creation
    time (exclusive). `tenant`: only that tenant's sessions (None: every session).
    """
    _check_limit(limit)
    query = _sessions(tenant)
    if metadata:
        if not all(isinstance(key, str) for key in metadata):
            raise InvalidTurn("metadata filter keys must be strings")
        query = query.where(ChatSession.metadata_.contains(dict(metadata)))
    if created_after is not None:
        query = query.where(ChatSession.created_at > created_after)
    if created_before is not None:
        query = query.where(ChatSession.created_at < created_before)
    if cursor is not None:
        created, session_id = _decode("s", cursor, 2)
        try:
            after = (datetime.fromisoformat(created), uuid.UUID(session_id))
        except ValueError:
            raise InvalidCursor(f"cursor {cursor[:60]!r} is not a cursor of this list") from None
        query = query.where(tuple_(ChatSession.created_at, ChatSession.id) < after)
    query = query.order_by(ChatSession.created_at.desc(), ChatSession.id.desc()).limit(limit + 1)
    with session_scope() as db:
        rows = db.execute(query).all()
        sessions = [session_dict(row[0], row[1] or []) for row in rows[:limit]]
        last = rows[limit - 1][0] if len(rows) > limit else None
        next_cursor = None if last is None else _encode("s", last.created_at.isoformat(), str(last.id))
    return SessionPage(sessions=sessions, next_cursor=next_cursor)


def message_dict(row: ChatMessage) -> dict[str, Any]:
    """A stored message in the JSON form of `chatq show --json` and the `final` event."""
    return {
        "id": row.id,
        "role": row.role,
        "content": row.content,
        "tool_calls": row.tool_calls,
        "tool_call_id": row.tool_call_id,
        "images": row.images,
        "citations": row.citations,
        "position": row.position,
    }


def turn_dict(turn: Turn, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A turn with its messages, in the JSON form of `chatq show --json` and `GET /turns/{id}`."""
    return {
        "id": str(turn.id),
        "session_id": str(turn.session_id),
        "position": turn.position,
        "status": turn.status.value,
        "attempts": turn.attempts,
        "error": turn.error,
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.total_tokens,
        },
        "created_at": turn.created_at.isoformat() if turn.created_at else None,
        "started_at": turn.started_at.isoformat() if turn.started_at else None,
        "finished_at": turn.finished_at.isoformat() if turn.finished_at else None,
        "run_at": turn.run_at.isoformat() if turn.run_at else None,
        "messages": list(messages),
    }


def list_turns(
    session_id: uuid.UUID | str, *, limit: int = 20, before: str | None = None, tenant: str | None = None
) -> TurnPage:
    """A page of a session's turns, each with its messages: the newest `limit` turns before the cursor
    (all turns when None), oldest first within the page. SessionNotFound as for `get_session`."""
    _check_limit(limit)
    session_uuid = parse_uuid(str(session_id), "session_id")
    # A delayed turn (and one cancelled before it was due) has no position: not in the history yet.
    conditions = [Turn.session_id == session_uuid, Turn.position.is_not(None)]
    if before is not None:
        (position,) = _decode("t", before, 1)
        if not position.isdigit() or len(position) > 12:
            raise InvalidCursor(f"cursor {before[:60]!r} is not a cursor of this list")
        conditions.append(Turn.position < int(position))
    with session_scope() as db:
        scoped_session(db, session_uuid, tenant)
        rows = list(
            db.execute(select(Turn).where(and_(*conditions)).order_by(Turn.position.desc()).limit(limit + 1)).scalars()
        )
        page = list(reversed(rows[:limit]))
        messages: dict[uuid.UUID, list[dict[str, Any]]] = {turn.id: [] for turn in page}
        first, last = (page[0].position, page[-1].position) if page else (None, None)
        if first is not None and last is not None:  # every turn of a page has a position (above)
            # The page's turns hold one range of message positions: one scan of the session's
            # (session_id, position) index, as long or short as the page, wherever it lies.
            found = db.execute(
                select(ChatMessage)
                .where(
                    ChatMessage.session_id == session_uuid,
                    ChatMessage.position >= first * MESSAGE_POSITION_STRIDE,
                    ChatMessage.position < (last + 1) * MESSAGE_POSITION_STRIDE,
                )
                .order_by(ChatMessage.position)
            ).scalars()
            for message in found:
                if message.turn_id in messages:
                    messages[message.turn_id].append(message_dict(message))
        turns = [turn_dict(turn, messages[turn.id]) for turn in page]
        next_cursor = _encode("t", str(page[0].position)) if len(rows) > limit and page else None
    return TurnPage(turns=turns, next_cursor=next_cursor)

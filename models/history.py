"""A session's conversation history as stored: the rows a turn's history is cut from.

The store side of history (`handlers.history.trim_history` does the cutting, a pure function over
what this hands it): `session_history(session, reply_to)` opens one autocommit connection and gives
a `SessionHistory` whose `page(cursor, limit)` reads messages newest first and whose
`earlier(boundary)` says how much lies before a position.

What counts as history: the session's messages that belong to *succeeded* turns (so the running
turn's own user message, turns queued behind it and failed or cancelled turns never appear), and
with `reply_to` only those stored before that user message (regenerate and edit).

Cost: pages are keyset pages on the (session_id, position) unique index, newest first, so the rows
read depend on how many pages the caller asks for, not on the session's length. `earlier` reads
the running totals each succeeded turn keeps (`Turn.history_messages`, `Turn.history_turns`,
written when it succeeds): one index probe, not a count of the session's rows.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Integer, Select, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by

from models.db import autocommit_scope
from models.errors import NotAUserMessage
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, Turn, TurnStatus

__all__ = ["EarlierHistory", "HistoryRow", "SessionHistory", "session_history"]

SNIPPET_CHARS = 200
"""Characters of an omitted user message fetched for the summary (messages can be 100k chars)."""
_SNIPPET_MESSAGES = 2


@dataclass(frozen=True, kw_only=True)
class HistoryRow:
    """One stored message of a succeeded turn."""

    position: int
    """Its place in the session (`ChatMessage.position`); pages go down from here."""
    turn_id: uuid.UUID
    """The turn it belongs to: a turn's messages are contiguous by position."""
    role: str
    """`user`, `assistant` or `tool`."""
    content: str | None
    """Its text."""
    tool_calls: list[dict[str, Any]] | None
    """An assistant message's tool calls `[{"id", "name", "args"}]`."""
    tool_call_id: str | None
    """The call a tool message answers."""


@dataclass(frozen=True, kw_only=True)
class EarlierHistory:
    """What precedes a position in the session's history."""

    messages: int
    """History messages before it."""
    turns: int
    """Succeeded turns before it."""
    snippets: tuple[str, ...]
    """The first `SNIPPET_CHARS` characters of the earliest user messages (at most two)."""


@contextmanager
def session_history(session: Any, reply_to: int | None = None) -> Iterator[SessionHistory]:
    """The history of `session` (anything with an `.id`, or the id), before `reply_to` when given.

    One autocommit connection serves every read: pages go backwards by position, and every turn
    older than the running one has ended, so nothing they read can change between statements (a
    snapshot would cost two more round trips around what is usually one query). Raises
    ValueError for an id that is not a UUID, NotAUserMessage for a `reply_to` that is not a user
    message of this session.
    """
    session_id = _session_uuid(getattr(session, "id", session))
    with autocommit_scope() as conn:
        before = _reply_position(conn, session_id, reply_to) if reply_to is not None else None
        yield SessionHistory(conn, session_id, before)


class SessionHistory:
    """Reads of one session's history below a starting position (see `session_history`)."""

    def __init__(self, conn: Connection, session_id: uuid.UUID, before: int | None) -> None:
        self._conn, self.session_id, self.before = conn, session_id, before

    def page(self, cursor: int | None, limit: int) -> list[HistoryRow]:
        """Up to `limit` rows below position `cursor` (None: below the start), newest first."""
        cursor = self.before if cursor is None else cursor
        statement = _page_statement(after_cursor=cursor is not None)
        rows = self._conn.execute(statement, {"session_id": self.session_id, "cursor": cursor, "limit": limit})
        return [
            HistoryRow(
                position=int(row.position),
                turn_id=row.turn_id,
                role=row.role,
                content=row.content,
                tool_calls=row.tool_calls or None,
                tool_call_id=row.tool_call_id,
            )
            for row in rows
        ]

    def earlier(self, boundary: int | None) -> EarlierHistory:
        """The history below position `boundary` (None: below the start): counts and first words."""
        boundary = self.before if boundary is None else boundary
        params: dict[str, Any] = {"session_id": self.session_id}
        bounded = boundary is not None
        if boundary is not None:
            params.update(boundary=boundary, boundary_turn=boundary // MESSAGE_POSITION_STRIDE)
        row = self._conn.execute(_totals_statement(bounded=bounded), params).one()
        if row.any and (row.messages is None or row.turns is None):
            row = self._conn.execute(_counted_statement(bounded=bounded), params).one()
        snippets = tuple(s for s in row.snippets or () if s)
        return EarlierHistory(messages=int(row.messages or 0), turns=int(row.turns or 0), snippets=snippets)


def _session_uuid(raw: Any) -> uuid.UUID:
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise ValueError(f"session id {raw!r} is not a UUID") from None


def _reply_position(conn: Connection, session_id: uuid.UUID, reply_to: int) -> int:
    """Position of the user message `reply_to` in this session; history is what precedes it."""
    row = conn.execute(
        select(ChatMessage.position, ChatMessage.role).where(
            ChatMessage.id == reply_to, ChatMessage.session_id == session_id
        )
    ).first()
    if row is None:
        raise NotAUserMessage(f"reply_to {reply_to} is not a user message of this session (no such message in it)")
    if row.role != "user":
        raise NotAUserMessage(f"reply_to {reply_to} is not a user message of this session (it is a {row.role} message)")
    return int(row.position)


# Statements are built once per process (on first use) with bound parameters: constructing
# SQLAlchemy expressions costs more Python time than running these small queries.


@functools.cache
def _page_statement(*, after_cursor: bool) -> Select[Any]:
    """One page of history, newest first: messages of succeeded turns (inner join: a message
    without a turn is never history), on a backward scan of the (session_id, position) index."""
    query = (
        select(
            ChatMessage.position,
            ChatMessage.turn_id,
            ChatMessage.role,
            ChatMessage.content,
            ChatMessage.tool_calls,
            ChatMessage.tool_call_id,
        )
        .join(Turn, Turn.id == ChatMessage.turn_id)
        .where(ChatMessage.session_id == bindparam("session_id"), Turn.status == TurnStatus.SUCCEEDED)
    )
    if after_cursor:
        query = query.where(ChatMessage.position < bindparam("cursor"))
    return query.order_by(ChatMessage.position.desc()).limit(bindparam("limit", type_=Integer))


def _earliest_snippets(messages_before: list[Any]) -> Any:
    """The first words of the earliest user messages: they say what the conversation was about."""
    earliest = (
        select(ChatMessage.position, func.left(ChatMessage.content, SNIPPET_CHARS).label("head"))
        .join(Turn, Turn.id == ChatMessage.turn_id)
        .where(*messages_before, Turn.status == TurnStatus.SUCCEEDED, ChatMessage.role == "user")
        .order_by(ChatMessage.position)
        .limit(_SNIPPET_MESSAGES)
        .subquery()
    )
    return select(func.array_agg(aggregate_order_by(earliest.c.head, earliest.c.position))).scalar_subquery()


def _bounds(*, bounded: bool) -> tuple[list[Any], list[Any]]:
    """WHERE clauses for the session's messages and turns before the boundary (a turn's first
    message, so the turns before it are those below `boundary // MESSAGE_POSITION_STRIDE`)."""
    messages_before = [ChatMessage.session_id == bindparam("session_id")]
    turns_before = [Turn.session_id == bindparam("session_id")]
    if bounded:
        messages_before.append(ChatMessage.position < bindparam("boundary"))
        turns_before.append(Turn.position < bindparam("boundary_turn"))
    return messages_before, turns_before


@functools.cache
def _totals_statement(*, bounded: bool) -> Select[Any]:
    """The running totals of the last succeeded turn before the boundary (`Turn.history_messages`,
    `Turn.history_turns`), which are the history before it, and the earliest user messages.

    Two index probes whatever the session's length; NULL totals (a turn stored by a chatq older
    than the totals) send the caller to `_counted_statement`.
    """
    messages_before, turns_before = _bounds(bounded=bounded)

    def last(column: Any) -> Any:
        return (
            select(column)
            .where(*turns_before, Turn.status == TurnStatus.SUCCEEDED)
            .order_by(Turn.position.desc())
            .limit(1)
            .scalar_subquery()
        )

    return select(
        last(Turn.history_messages).label("messages"),
        last(Turn.history_turns).label("turns"),
        select(Turn.id).where(*turns_before, Turn.status == TurnStatus.SUCCEEDED).exists().label("any"),
        _earliest_snippets(messages_before).label("snippets"),
    )


@functools.cache
def _counted_statement(*, bounded: bool) -> Select[Any]:
    """The same counts by counting: every earlier message and turn on the (session_id, position)
    unique indexes (index-only scans), minus what the session's other-than-succeeded turns hold.
    Linear in the earlier messages (BENCHMARKS.md, history_scale); only for sessions whose totals
    are missing."""
    messages_before, turns_before = _bounds(bounded=bounded)
    all_messages = select(func.count()).select_from(ChatMessage).where(*messages_before).scalar_subquery()
    all_turns = select(func.count()).select_from(Turn).where(*turns_before).scalar_subquery()
    excluded = (
        select(func.count(func.distinct(Turn.id)).label("turns"), func.count(ChatMessage.id).label("messages"))
        .select_from(Turn)
        .outerjoin(ChatMessage, and_(ChatMessage.turn_id == Turn.id, *messages_before))
        .where(*turns_before, Turn.status != TurnStatus.SUCCEEDED)
        .cte("excluded")
    )
    return select(
        (all_messages - excluded.c.messages).label("messages"),
        (all_turns - excluded.c.turns).label("turns"),
        _earliest_snippets(messages_before).label("snippets"),
    ).select_from(excluded)

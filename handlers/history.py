"""Conversation history for a turn, cut to a token budget (shared by every agent framework).

`build_history()` returns framework-neutral message dicts; each handler converts them to its own
message types, so history behaviour cannot drift between frameworks.

What counts as history: the session's messages that belong to *succeeded* turns (so the running
turn's own user message, turns queued behind it and failed or cancelled turns never appear), and
with `reply_to` only those stored before that user message (regenerate and edit).

Turns are kept or dropped whole, newest first, so a tool result never loses the assistant message
whose tool call it answers.

Cost: messages are read newest-first in keyset pages on the (session_id, position) unique index, sized
from the budget left, and reading stops as soon as the budget is full, so the rows read depend on
the budget, not on the session's length. Only when something was left out does one more statement
say how much: each succeeded turn keeps the session's running totals (`Turn.history_messages`,
`Turn.history_turns`, written when it succeeds), so that is one index probe, not a count of the
session's rows.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Integer, Row, Select, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by

from chatq.settings import get_settings
from handlers.errors import HandlerError
from handlers.tokens import count_message_tokens, count_tokens
from models.db import autocommit_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, Turn, TurnStatus

__all__ = ["History", "build_history"]

_MIN_PAGE = 16
_MAX_PAGE = 200
"""The first page is `_MIN_PAGE` rows; later ones are sized from the tokens per row seen so far
(with a fifth to spare), so a session of long messages is not read 200 rows at a time to keep ten,
and one of short messages still needs few round trips."""

_SNIPPET_CHARS = 200
"""Characters of an omitted user message fetched for the summary (messages can be 100k chars)."""
_SNIPPET_WORDS = 12
_SNIPPET_MESSAGES = 2


@dataclass(frozen=True, kw_only=True)
class History:
    """The part of a session's conversation sent with a turn."""

    messages: list[dict[str, Any]]
    """Oldest first; each `{"role", "content", "tool_calls", "tool_call_id"}`."""
    omitted: int
    """How many earlier history messages were left out to fit the budget."""
    summary: str | None
    """One line describing what was left out; None when nothing was."""
    tokens: int
    """Estimated tokens of `messages` (see `handlers.tokens`)."""


def build_history(
    session: Any,
    reply_to: int | None = None,
    prompt: str = "",
    *,
    budget_tokens: int | None = None,
) -> History:
    """As much recent history of `session` as fits the budget, in whole turns, plus a summary.

    `session` is anything with an `.id` (an `AgentSession`). `reply_to` is the id of a user message of
    this session: only messages before it are history. The budget (`CHATQ_HISTORY_TOKENS` by
    default) is first reduced by the tokens of `prompt`, the new user message.

    Raises HandlerError when `reply_to` is not a user message of this session.
    """
    session_id = _session_uuid(session)
    budget = get_settings().history_tokens if budget_tokens is None else budget_tokens
    remaining = budget - count_tokens(prompt)
    # Autocommit, not one snapshot: pages go backwards by position, and every turn older than the
    # running one has ended, so nothing they read can change between statements. A snapshot cost
    # two round trips (BEGIN, ROLLBACK) around what is usually one query.
    with autocommit_scope() as conn:
        before = _reply_position(conn, session_id, reply_to) if reply_to is not None else None
        kept = _collect(conn, session_id, before, remaining)
        if kept.complete:
            omitted, summary = 0, None
        else:
            omitted, summary = _omitted(conn, session_id, before if kept.oldest is None else kept.oldest)
    return History(messages=kept.messages[::-1], omitted=omitted, summary=summary, tokens=kept.tokens)


@dataclass(frozen=True, kw_only=True)
class _Kept:
    """What `_collect` read: the turns that fit, newest message first."""

    messages: list[dict[str, Any]]
    """The kept messages, newest first."""
    tokens: int
    """Their estimated tokens."""
    oldest: int | None
    """Position of the oldest kept message; everything before it is omitted unless `complete`."""
    complete: bool
    """True when the history ran out before the budget did: nothing was omitted."""


def _session_uuid(session: Any) -> uuid.UUID:
    raw = session.id
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise HandlerError(f"session id {raw!r} is not a UUID") from None


def _reply_position(conn: Connection, session_id: uuid.UUID, reply_to: int) -> int:
    """Position of the user message `reply_to` in this session; history is what precedes it."""
    row = conn.execute(
        select(ChatMessage.position, ChatMessage.role).where(
            ChatMessage.id == reply_to, ChatMessage.session_id == session_id
        )
    ).first()
    if row is None:
        raise HandlerError(f"reply_to {reply_to} is not a user message of this session (no such message in it)")
    if row.role != "user":
        raise HandlerError(f"reply_to {reply_to} is not a user message of this session (it is a {row.role} message)")
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


def _collect(conn: Connection, session_id: uuid.UUID, before: int | None, remaining: int) -> _Kept:
    """Whole turns, newest first, while they fit `remaining` tokens; reads no more pages than that."""
    kept: list[dict[str, Any]] = []
    kept_tokens = 0
    oldest: int | None = None
    turn: list[dict[str, Any]] = []  # the turn being read, newest message first
    turn_id: Any = None
    turn_tokens = 0
    cursor = before
    rows_read = 0
    if remaining <= 0:
        return _Kept(messages=kept, tokens=0, oldest=None, complete=False)
    while True:
        limit = _MIN_PAGE
        if rows_read:
            tokens_per_row = max(1, (kept_tokens + turn_tokens) // rows_read)
            rows_left = (remaining - kept_tokens - turn_tokens) // tokens_per_row + 1
            limit = min(_MAX_PAGE, max(_MIN_PAGE, rows_left + rows_left // 5))
        statement = _page_statement(after_cursor=cursor is not None)
        rows = conn.execute(statement, {"session_id": session_id, "cursor": cursor, "limit": limit}).all()
        rows_read += len(rows)
        for row in rows:
            if turn and row.turn_id != turn_id:
                # The previous row ended a turn (a turn's messages are contiguous by position): keep it.
                kept.extend(turn)
                kept_tokens += turn_tokens
                oldest = cursor  # the previous row: the oldest message of that turn
                turn, turn_tokens = [], 0
            turn_id = row.turn_id
            message = _message(row)
            turn_tokens += count_message_tokens(message)
            if kept_tokens + turn_tokens > remaining:
                # This turn cannot fit whole: it and everything older are omitted.
                return _Kept(messages=kept, tokens=kept_tokens, oldest=oldest, complete=False)
            turn.append(message)
            cursor = row.position
        if len(rows) < limit:
            kept.extend(turn)
            return _Kept(messages=kept, tokens=kept_tokens + turn_tokens, oldest=None, complete=True)


def _message(row: Row[Any]) -> dict[str, Any]:
    return {
        "role": row.role,
        "content": row.content or "",
        "tool_calls": row.tool_calls or None,
        "tool_call_id": row.tool_call_id,
    }


def _earliest_snippets(messages_before: list[Any]) -> Any:
    """The first words of the earliest user messages: they say what the conversation was about."""
    earliest = (
        select(ChatMessage.position, func.left(ChatMessage.content, _SNIPPET_CHARS).label("head"))
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


def _omitted(conn: Connection, session_id: uuid.UUID, boundary: int | None) -> tuple[int, str | None]:
    """How many history messages precede `boundary` (None: all of them), and a one-line summary."""
    params: dict[str, Any] = {"session_id": session_id}
    bounded = boundary is not None
    if boundary is not None:
        params.update(boundary=boundary, boundary_turn=boundary // MESSAGE_POSITION_STRIDE)
    row = conn.execute(_totals_statement(bounded=bounded), params).one()
    if row.any and (row.messages is None or row.turns is None):
        row = conn.execute(_counted_statement(bounded=bounded), params).one()
    messages, turns = int(row.messages or 0), int(row.turns or 0)
    if messages <= 0:
        return 0, None
    return messages, _summary(messages, turns, row.snippets or ())


def _summary(messages: int, turns: int, snippets: Sequence[str | None]) -> str:
    noun = "message" if messages == 1 else "messages"
    turn_noun = "turn" if turns == 1 else "turns"
    line = f"{messages} earlier {noun} from {turns} {turn_noun} omitted"
    quoted = [_first_words(s) for s in snippets if s and s.strip()]
    if quoted:
        line += "; the conversation began with: " + "; ".join(f'"{q}"' for q in quoted)
    return line + "."


def _first_words(text: str) -> str:
    words = text.split()
    head = " ".join(words[:_SNIPPET_WORDS])
    return head + " ..." if len(words) > _SNIPPET_WORDS or len(text) >= _SNIPPET_CHARS else head

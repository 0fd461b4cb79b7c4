"""Conversation history for a turn, cut to a token budget (seed "Shared Modules").

`build_history()` returns framework-neutral message dicts; each handler converts them to its own
message types, so history behaviour cannot drift between frameworks.

What counts as history: the session's messages that belong to *succeeded* turns (so the running
turn's own user message, turns queued behind it and failed or cancelled turns never appear), and
with `reply_to` only those stored before that user message (regenerate and edit).

Cost: messages are read newest-first in keyset pages on the (session_id, position) unique index and
reading stops as soon as the budget is full, so a long session costs about what a short one does.
Turns are kept or dropped whole, newest first, so a tool result never loses the assistant message
whose tool call it answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, Select, func, select

from handlers.errors import HandlerError
from handlers.tokens import count_message_tokens, count_tokens
from models.db import get_engine
from models.tables import ChatMessage, Turn, TurnStatus
from worker.config import get_settings

__all__ = ["History", "build_history"]

_MIN_PAGE = 16
_MAX_PAGE = 200
_TOKENS_PER_ROW_GUESS = 32
"""Sizes the next page from the budget left: small budgets read small pages, big ones up to 200 rows."""

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
    with get_engine().connect() as conn:
        # One snapshot for every page and the count, so a turn finishing meanwhile cannot skew them.
        conn.execution_options(isolation_level="REPEATABLE READ")
        before = _reply_position(conn, session_id, reply_to) if reply_to is not None else None
        kept = _collect(conn, session_id, before, remaining)
        omitted, summary = (
            (0, None) if kept.complete else _omitted(conn, session_id, before if kept.oldest is None else kept.oldest)
        )
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


def _history_rows(session_id: uuid.UUID) -> Select[Any]:
    """Messages of the session's succeeded turns (inner join: messages without a turn never count)."""
    return (
        select(
            ChatMessage.position,
            ChatMessage.turn_id,
            ChatMessage.role,
            ChatMessage.content,
            ChatMessage.tool_calls,
            ChatMessage.tool_call_id,
        )
        .join(Turn, Turn.id == ChatMessage.turn_id)
        .where(ChatMessage.session_id == session_id, Turn.status == TurnStatus.SUCCEEDED)
    )


def _collect(conn: Connection, session_id: uuid.UUID, before: int | None, remaining: int) -> _Kept:
    """Whole turns, newest first, while they fit `remaining` tokens; reads no more pages than that."""
    kept: list[dict[str, Any]] = []
    kept_tokens = 0
    oldest: int | None = None
    turn: list[dict[str, Any]] = []  # the turn being read, newest message first
    turn_id: Any = None
    turn_tokens = 0
    cursor = before
    if remaining <= 0:
        return _Kept(messages=kept, tokens=0, oldest=None, complete=False)
    while True:
        limit = min(_MAX_PAGE, max(_MIN_PAGE, (remaining - kept_tokens) // _TOKENS_PER_ROW_GUESS))
        query = _history_rows(session_id)
        if cursor is not None:
            query = query.where(ChatMessage.position < cursor)
        rows = conn.execute(query.order_by(ChatMessage.position.desc()).limit(limit)).all()
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


def _omitted(conn: Connection, session_id: uuid.UUID, boundary: int | None) -> tuple[int, str | None]:
    """How many history messages precede `boundary`, and a one-line summary of them."""
    where = [ChatMessage.session_id == session_id, Turn.status == TurnStatus.SUCCEEDED]
    if boundary is not None:
        where.append(ChatMessage.position < boundary)
    counts = conn.execute(
        select(func.count(), func.count(func.distinct(ChatMessage.turn_id)))
        .select_from(ChatMessage)
        .join(Turn, Turn.id == ChatMessage.turn_id)
        .where(*where)
    ).one()
    messages, turns = int(counts[0]), int(counts[1])
    if messages == 0:
        return 0, None
    # The earliest user messages say what the conversation was about; fetch only their first words.
    snippets = conn.scalars(
        select(func.left(ChatMessage.content, _SNIPPET_CHARS))
        .join(Turn, Turn.id == ChatMessage.turn_id)
        .where(*where, ChatMessage.role == "user")
        .order_by(ChatMessage.position)
        .limit(_SNIPPET_MESSAGES)
    ).all()
    return messages, _summary(messages, turns, snippets)


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

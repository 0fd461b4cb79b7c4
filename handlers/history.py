"""Conversation history for a turn, cut to a token budget (shared by every agent framework).

A pure function over rows handed in: the store reads them (`handlers.store.HistoryPages`, chatq's
is `models.history.session_history`), `trim_history()` decides how many to read and keeps what fits.
It returns framework-neutral message dicts; each handler converts them to its own message types, so
history behaviour cannot drift between frameworks.

Turns are kept or dropped whole, newest first, so a tool result never loses the assistant message
whose tool call it answers.

Cost: pages are asked for newest first, sized from the budget left, and reading stops as soon as
the budget is full, so the rows read depend on the budget, not on the session's length. Only when
something was left out is the store asked how much (`HistoryPages.earlier`, one index probe).

A plain handler reads its history the same way:

    with session_history(self.session, reply_to) as pages:      # models.history
        history = trim_history(pages, user_message)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.handler_settings import process_handler_settings
from handlers.store import HistoryPages, HistoryRow
from handlers.tokens import count_message_tokens, count_tokens

__all__ = ["History", "trim_history"]

_MIN_PAGE = 16
_MAX_PAGE = 200
"""The first page is `_MIN_PAGE` rows; later ones are sized from the tokens per row seen so far
(with a fifth to spare), so a session of long messages is not read 200 rows at a time to keep ten,
and one of short messages still needs few round trips."""

_SNIPPET_CHARS = 200
"""A snippet this long was cut by the store (`models.history.SNIPPET_CHARS`): it ends with "..."."""
_SNIPPET_WORDS = 12


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


def trim_history(pages: HistoryPages, prompt: str = "", *, budget_tokens: int | None = None) -> History:
    """As much recent history from `pages` as fits the budget, in whole turns, plus a summary.

    The budget, `budget_tokens`, is first reduced by the tokens of `prompt`, the new user message.
    `build_turn_input` hands in the worker's `CHATQ_HISTORY_TOKENS`; a plain handler that passes
    none gets this process's (read at this entry, `handlers.handler_settings`). Errors of the store
    pass through unchanged.
    """
    budget = process_handler_settings().history_tokens if budget_tokens is None else budget_tokens
    kept = _collect(pages, budget - count_tokens(prompt))
    if kept.complete:
        omitted, summary = 0, None
    else:
        earlier = pages.earlier(kept.oldest)
        omitted = max(0, earlier.messages)
        summary = _summary(earlier.messages, earlier.turns, earlier.snippets) if omitted else None
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


def _collect(pages: HistoryPages, remaining: int) -> _Kept:
    """Whole turns, newest first, while they fit `remaining` tokens; reads no more pages than that."""
    kept: list[dict[str, Any]] = []
    kept_tokens = 0
    oldest: int | None = None
    turn: list[dict[str, Any]] = []  # the turn being read, newest message first
    turn_id: Any = None
    turn_tokens = 0
    cursor: int | None = None
    rows_read = 0
    if remaining <= 0:
        return _Kept(messages=kept, tokens=0, oldest=None, complete=False)
    while True:
        limit = _MIN_PAGE
        if rows_read:
            tokens_per_row = max(1, (kept_tokens + turn_tokens) // rows_read)
            rows_left = (remaining - kept_tokens - turn_tokens) // tokens_per_row + 1
            limit = min(_MAX_PAGE, max(_MIN_PAGE, rows_left + rows_left // 5))
        rows = pages.page(cursor, limit)
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


def _message(row: HistoryRow) -> dict[str, Any]:
    return {
        "role": row.role,
        "content": row.content or "",
        "tool_calls": row.tool_calls or None,
        "tool_call_id": row.tool_call_id,
    }


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

"""The sweep's step that publishes the terminal events whose publisher died before sending them.

A turn's end is committed in Postgres first and its terminal event published after, so a process
killed in between (`kill -9` right after `complete_turn`) used to leave a turn `succeeded` with no
`final` event, and every consumer of its stream waiting. Now each turn that may end is in the
unended set from its `started` event (or from its cancel) until its terminal event is out
(`worker.event_scripts`). The sweep reads the set's entries older than `SETTLE` seconds and looks
their turns up by primary key: a turn ended in Postgres gets the terminal event its status says
(`final` with the stored reply and usage, `error`, or `cancelled`), marked `"repaired": true` and
numbered after its stream's newest event. It is published by the same script, under the same
per-turn marker, as a live terminal event, so exactly one goes out whoever races whom. An
unfinished turn goes to the back of the set, and one that no longer exists (its session was
deleted) leaves it. The work is bounded by the turns in flight, never by the turns table.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import Engine, func, select

from models.db import session_scope
from models.tables import ChatMessage, Turn, TurnStatus
from worker.event_scripts import PUBLISH_TERMINAL_SHA, UNENDED, run_script, split_at_seq, terminal_arguments
from worker.events import EventType, TurnEvents, encode_event, session_channel, turn_stream

log = logging.getLogger(__name__)

SETTLE = 5.0
"""Seconds a turn must have ended before the sweep publishes for it: its own publisher does so
within milliseconds of the commit, and the per-turn marker keeps a slower one from sending a second."""

BATCH = 500
"""Entries of the unended set one sweep looks at (the oldest first)."""

_TERMINAL = {
    TurnStatus.SUCCEEDED: EventType.FINAL,
    TurnStatus.FAILED: EventType.ERROR,
    TurnStatus.CANCELLED: EventType.CANCELLED,
}


def publish_missing_terminal_events(
    *,
    settle: float | None = None,
    limit: int = BATCH,
    engine: Engine,
    client: redis.Redis,
    retention: int,
) -> list[uuid.UUID]:
    """One pass over the unended set (see the module docstring); returns the turns it published for.

    `settle`: SETTLE unless given; `engine`, `client` and `retention` (seconds) are the runtime's.
    """
    settle = SETTLE if settle is None else settle
    now = time.time()
    members = client.zrangebyscore(UNENDED, "-inf", now - settle, start=0, num=limit)
    if not members:
        return []
    ids: dict[uuid.UUID, str] = {}
    junk: list[str] = []
    for raw in members:
        member = raw.decode() if isinstance(raw, bytes) else str(raw)
        try:
            ids[uuid.UUID(member)] = member
        except ValueError:
            junk.append(member)
    with session_scope(engine) as db:
        db_now = db.execute(select(func.now())).scalar_one()
        rows = db.execute(
            select(
                Turn.id,
                Turn.session_id,
                Turn.status,
                Turn.attempts,
                Turn.error,
                Turn.prompt_tokens,
                Turn.completion_tokens,
                Turn.total_tokens,
                Turn.finished_at,
            ).where(Turn.id.in_(list(ids)))
        ).all()
        cutoff = db_now - timedelta(seconds=settle)
        settled = [row for row in rows if row.status.finished and row.finished_at and row.finished_at <= cutoff]
        replies = _replies(db, [row.id for row in settled if row.status is TurnStatus.SUCCEEDED])
    found = {row.id for row in rows}
    gone = junk + [member for turn_id, member in ids.items() if turn_id not in found]
    ended = {row.id for row in settled}
    waiting = [ids[row.id] for row in rows if row.id not in ended]
    before: list[tuple[Any, ...]] = []
    if gone:
        before.append(("ZREM", UNENDED, *gone))
    if waiting:
        # To the back of the set: turns that run long must not keep the sweep from the ones after them.
        before.append(("ZADD", UNENDED, "XX", *[part for member in waiting for part in (f"{now:.3f}", member)]))
    calls = [_repair_arguments(row, replies.get(row.id, []), retention, client) for row in settled]
    if not calls and not before:
        return []
    results = run_script(client, PUBLISH_TERMINAL_SHA, calls, before=before)
    published = [row for row, result in zip(settled, results, strict=True) if result]
    for row in published:
        log.warning(
            "turn %s session %s: ended %s but its terminal event was never published (its publisher "
            "stopped); published it now, marked repaired",
            row.id,
            row.session_id,
            row.status.value,
        )
    return [row.id for row in published]


def _replies(db: Any, turn_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """The stored reply of each turn (its assistant and tool messages in order), as `final` carries it."""
    replies: dict[uuid.UUID, list[dict[str, Any]]] = {turn_id: [] for turn_id in turn_ids}
    if not turn_ids:
        return replies
    rows = db.execute(
        select(ChatMessage)
        .where(ChatMessage.turn_id.in_(list(turn_ids)), ChatMessage.role != "user")
        .order_by(ChatMessage.turn_id, ChatMessage.position)
    ).scalars()
    for message in rows:
        replies[message.turn_id].append(
            {
                "role": message.role,
                "content": message.content,
                "tool_calls": message.tool_calls,
                "tool_call_id": message.tool_call_id,
                "citations": message.citations,
            }
        )
    return replies


def _repair_arguments(row: Any, messages: list[dict[str, Any]], retention: int, client: redis.Redis) -> tuple[Any, ...]:
    """The terminal script's arguments for the event a turn's status says, numbered in Redis."""
    kind = _TERMINAL[row.status]
    fields: dict[str, Any] = {}
    if kind is EventType.FINAL:
        usage = {
            "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.completion_tokens,
            "total_tokens": row.total_tokens,
        }
        fields = {"messages": messages, "usage": usage}
    elif kind is EventType.ERROR:
        fields = {"error": row.error or "the turn failed"}
    # Built as a live event is (same fields, same order), with a stand-in seq the script replaces.
    builder = TurnEvents(session_id=row.session_id, turn_id=row.id, client=client, retention=retention)
    event = builder.build(kind, row.attempts, **fields, repaired=True)
    head, tail = split_at_seq(encode_event(event), event["seq"])
    return terminal_arguments(
        stream=turn_stream(row.id),
        channel=session_channel(row.session_id),
        turn_id=str(row.id),
        retention=retention,
        payload=head,
        tail=tail,
    )

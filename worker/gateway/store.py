"""The gateway's blocking Postgres reads. The app calls them through a worker thread, never on its event loop."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatSession, Turn
from worker.store.turns import runs_next

RECENT_FINISH = timedelta(seconds=60)
"""Finished turns younger than this may still have their terminal event on the way."""


def session_exists(session_id: uuid.UUID, tenant: str | None = None) -> bool:
    """True if the session is stored (and, with `tenant`, is that tenant's)."""
    query = select(ChatSession.id).where(ChatSession.id == session_id)
    if tenant is not None:
        query = query.where(ChatSession.tenant == tenant)
    with session_scope() as db:
        return db.execute(query).first() is not None


def turn_exists(turn_id: uuid.UUID, tenant: str | None = None) -> bool:
    """True if the turn is stored (and, with `tenant`, its session is that tenant's)."""
    query = select(Turn.id).where(Turn.id == turn_id)
    if tenant is not None:
        query = query.join(ChatSession, ChatSession.id == Turn.session_id).where(ChatSession.tenant == tenant)
    with session_scope() as db:
        return db.execute(query).first() is not None


def turns_from(session_id: uuid.UUID, position: int) -> list[tuple[str, int]]:
    """The session's turns at `position` and after, as (turn id, position), in order."""
    with session_scope() as db:
        rows = db.execute(
            select(Turn.id, Turn.position)
            .where(Turn.session_id == session_id, Turn.position >= position)
            .order_by(Turn.position)
        ).all()
    return [(str(turn_id), int(pos)) for turn_id, pos in rows if pos is not None]


def position_of(session_id: uuid.UUID, turn_id: str) -> int | None:
    """The position of a turn of this session, or None."""
    try:
        turn_uuid = uuid.UUID(turn_id)
    except ValueError:
        return None
    with session_scope() as db:
        position = db.execute(
            select(Turn.position).where(Turn.id == turn_uuid, Turn.session_id == session_id)
        ).scalar_one_or_none()
    return None if position is None else int(position)


def session_start(session_id: uuid.UUID) -> tuple[int, list[tuple[str, int]]]:
    """Where a new session stream starts, before checking Redis.

    Returns the lowest position of an unfinished turn (or the next position if none), and the
    turns before it that finished within `RECENT_FINISH`, as (turn id, position) in order.
    """
    with session_scope() as db:
        next_position = db.execute(
            select(ChatSession.next_turn_position).where(ChatSession.id == session_id)
        ).scalar_one_or_none()
        lowest_active = db.execute(
            select(Turn.position).where(Turn.session_id == session_id, runs_next())
        ).scalar_one_or_none()
        start = int(lowest_active) if lowest_active is not None else int(next_position or 0)
        recent = db.execute(
            select(Turn.id, Turn.position)
            .where(
                Turn.session_id == session_id,
                Turn.position < start,
                Turn.finished_at > func.now() - RECENT_FINISH,
            )
            .order_by(Turn.position)
        ).all()
    return start, [(str(turn_id), int(pos)) for turn_id, pos in recent if pos is not None]

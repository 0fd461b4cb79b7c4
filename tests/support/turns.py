"""Helpers for tests that run turns: wait for them in Postgres, read their events and rows."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis
from sqlalchemy import select

from models.db import session_scope
from models.tables import ChatMessage, Turn

FINISHED = ("succeeded", "failed", "cancelled")


def wait_for_turns(turn_ids: list[uuid.UUID], *, timeout: float = 60.0) -> dict[uuid.UUID, Turn]:
    """Poll Postgres until every turn is finished; return the rows."""
    deadline = time.monotonic() + timeout
    rows: dict[uuid.UUID, Turn] = {}
    while True:
        with session_scope() as db:
            rows = {row.id: row for row in db.execute(select(Turn).where(Turn.id.in_(turn_ids))).scalars()}
        if len(rows) == len(turn_ids) and all(row.status.value in FINISHED for row in rows.values()):
            return rows
        if time.monotonic() > deadline:
            states = {str(k)[:8]: v.status.value for k, v in rows.items()}
            raise AssertionError(f"turns not finished after {timeout}s: {states}")
        time.sleep(0.1)


def wait_for_turn(turn_id: uuid.UUID, *, timeout: float = 60.0) -> Turn:
    """Poll Postgres until the turn is finished."""
    return wait_for_turns([turn_id], timeout=timeout)[turn_id]


def wait_for_status(turn_id: uuid.UUID, status: str, *, timeout: float = 30.0) -> Turn:
    """Poll Postgres until the turn has `status`."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as db:
            row = db.get(Turn, turn_id)
        if row is not None and row.status.value == status:
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"turn {turn_id} is {row.status.value if row else 'missing'}, not {status}")
        time.sleep(0.05)


def stored_turn(turn_id: uuid.UUID) -> Turn:
    """The turn's row as stored now, detached from its session (it must exist)."""
    with session_scope() as db:
        turn = db.get(Turn, turn_id)
        assert turn is not None
        db.expunge(turn)
        return turn


def turn_messages(turn_id: uuid.UUID) -> list[ChatMessage]:
    """A turn's stored messages in order."""
    with session_scope() as db:
        return list(
            db.execute(select(ChatMessage).where(ChatMessage.turn_id == turn_id).order_by(ChatMessage.position))
            .scalars()
            .all()
        )


def session_messages(session_id: uuid.UUID) -> list[ChatMessage]:
    """A session's stored messages in order."""
    with session_scope() as db:
        return list(
            db.execute(select(ChatMessage).where(ChatMessage.session_id == session_id).order_by(ChatMessage.position))
            .scalars()
            .all()
        )


def replay_events(redis_url: str, turn_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every event in the turn's replay stream, in order."""
    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(fields[b"event"]) for _id, fields in client.xrange(f"chatq:events:{turn_id}")]
    finally:
        client.close()

"""Read-only views for `chatq show` and `chatq usage`."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn
from worker.errors import SessionNotFound, TurnNotFound
from worker.payload import parse_uuid


def message_dict(row: ChatMessage) -> dict[str, Any]:
    """A stored message in the JSON form of `chatq show --json` and the `final` event."""
    return {
        "id": row.id,
        "role": row.role,
        "content": row.content,
        "tool_calls": row.tool_calls,
        "tool_call_id": row.tool_call_id,
        "images": row.images,
        "position": row.position,
    }


def turn_report(turn_id: uuid.UUID | str) -> dict[str, Any]:
    """A turn with its messages in order (the user's first), as `chatq show --json` prints it."""
    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    with session_scope() as db:
        turn = db.get(Turn, turn_uuid)
        if turn is None:
            raise TurnNotFound(f"turn {turn_uuid} does not exist")
        messages = db.execute(
            select(ChatMessage).where(ChatMessage.turn_id == turn_uuid).order_by(ChatMessage.position)
        ).scalars()
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
            "messages": [message_dict(row) for row in messages],
        }


def usage_report(session_id: uuid.UUID | str | None = None) -> dict[str, Any]:
    """Token usage totals, overall or for one session, with a breakdown per model."""
    with session_scope() as db:
        query = (
            select(
                ChatSession.model,
                func.count(Turn.id),
                func.coalesce(func.sum(Turn.prompt_tokens), 0),
                func.coalesce(func.sum(Turn.completion_tokens), 0),
                func.coalesce(func.sum(Turn.total_tokens), 0),
            )
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .group_by(ChatSession.model)
            .order_by(ChatSession.model)
        )
        session_uuid = None
        if session_id is not None:
            session_uuid = parse_uuid(str(session_id), "session")
            if db.get(ChatSession, session_uuid) is None:
                raise SessionNotFound(f"session {session_uuid} does not exist")
            query = query.where(Turn.session_id == session_uuid)
        by_model: list[dict[str, Any]] = [
            {
                "model": model,
                "turns": int(n),
                "prompt_tokens": int(p),
                "completion_tokens": int(c),
                "total_tokens": int(t),
            }
            for model, n, p, c, t in db.execute(query).all()
        ]
    keys = ("turns", "prompt_tokens", "completion_tokens", "total_tokens")
    totals = {key: sum(int(row[key]) for row in by_model) for key in keys}
    return {"session_id": str(session_uuid) if session_uuid else None, **totals, "by_model": by_model}

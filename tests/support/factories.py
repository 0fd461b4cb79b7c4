"""Test data: sessions, turns and their messages written straight to Postgres.

Each test makes its own session (uuid ids), so tests share the run's database without seeing
each other's rows. Positions follow chatq's layout: a turn at position p stores its messages at
p * MESSAGE_POSITION_STRIDE + 0 (the user's), +1, +2, ...
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select, update

from models.db import session_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus
from worker.store.turns import recount_history_totals


@dataclass(frozen=True, kw_only=True)
class Msg:
    """A message to store with a turn."""

    role: str
    """`user`, `assistant` or `tool`."""
    content: str = ""
    """The text."""
    tool_calls: list[dict[str, Any]] | None = None
    """`[{"id", "name", "args"}]` for an assistant message that calls tools."""
    tool_call_id: str | None = None
    """For a tool message, the id of the call it answers."""


@dataclass(frozen=True, kw_only=True)
class TurnRef:
    """What `add_turn` created."""

    id: uuid.UUID
    """The turn id."""
    position: int
    """The turn's position in its session."""
    message_ids: list[int] = field(default_factory=list)
    """Ids of its messages, in order (the user's first)."""


def user(content: str) -> Msg:
    """A user message."""
    return Msg(role="user", content=content)


def assistant(content: str, tool_calls: list[dict[str, Any]] | None = None) -> Msg:
    """An assistant message, optionally calling tools."""
    return Msg(role="assistant", content=content, tool_calls=tool_calls)


def tool(content: str, call_id: str) -> Msg:
    """A tool result answering `call_id`."""
    return Msg(role="tool", content=content, tool_call_id=call_id)


def create_session(
    *, system_prompt: str | None = None, agent_framework: str = "none", model: str = "echo"
) -> uuid.UUID:
    """A new chat session; returns its id."""
    session_id = uuid.uuid4()
    with session_scope() as db:
        db.add(ChatSession(id=session_id, agent_framework=agent_framework, model=model, system_prompt=system_prompt))
    return session_id


def _reserve_positions(db: Any, session_id: uuid.UUID, count: int) -> int:
    """Take `count` turn positions of the session, as the producer does under the row lock."""
    first = db.execute(
        select(ChatSession.next_turn_position).where(ChatSession.id == session_id).with_for_update()
    ).scalar_one()
    db.execute(update(ChatSession).where(ChatSession.id == session_id).values(next_turn_position=first + count))
    return int(first)


def add_turn(session_id: uuid.UUID, messages: Sequence[Msg], *, status: TurnStatus = TurnStatus.SUCCEEDED) -> TurnRef:
    """Store a turn of the session with `messages` (the user's first) at the next position."""
    turn_id = uuid.uuid4()
    with session_scope() as db:
        position = _reserve_positions(db, session_id, 1)
        db.add(Turn(id=turn_id, session_id=session_id, position=position, status=status))
        db.flush()
        rows = [
            ChatMessage(
                session_id=session_id,
                turn_id=turn_id,
                position=position * MESSAGE_POSITION_STRIDE + index,
                role=m.role,
                content=m.content,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
            )
            for index, m in enumerate(messages)
        ]
        db.add_all(rows)
        db.flush()
        # The running totals complete_turn keeps, as if the turn had run.
        recount_history_totals(db, session_id)
        return TurnRef(id=turn_id, position=position, message_ids=[r.id for r in rows])


def add_many_turns(
    session_id: uuid.UUID,
    turns: int,
    *,
    words: int = 8,
    status: TurnStatus = TurnStatus.SUCCEEDED,
) -> None:
    """Store `turns` turns of 4 messages (user, tool call, tool result, answer) in bulk, for big sessions.

    Every turn costs the same tokens (numbers are zero-padded), so sessions of different lengths
    keep the same number of turns under the same budget."""
    with session_scope() as db:
        first = _reserve_positions(db, session_id, turns)
        turn_rows: list[dict[str, Any]] = []
        message_rows: list[dict[str, Any]] = []
        text = " ".join(["word"] * words)
        for offset in range(turns):
            turn_id = uuid.uuid4()
            position = first + offset
            turn_rows.append({"id": turn_id, "session_id": session_id, "position": position, "status": status})
            base = position * MESSAGE_POSITION_STRIDE
            call = {"id": f"call-{position:06d}", "name": "calculator", "args": {"expression": "6*7"}}
            for index, (role, content, calls, call_id) in enumerate(
                (
                    ("user", f"question {position:06d} {text}", None, None),
                    ("assistant", "", [call], None),
                    ("tool", "42", None, call["id"]),
                    ("assistant", f"answer {position:06d} {text}", None, None),
                )
            ):
                message_rows.append(
                    {
                        "session_id": session_id,
                        "turn_id": turn_id,
                        "position": base + index,
                        "role": role,
                        "content": content,
                        "tool_calls": calls,
                        "tool_call_id": call_id,
                    }
                )
        db.execute(insert(Turn), turn_rows)
        db.execute(insert(ChatMessage), message_rows)
        recount_history_totals(db, session_id)

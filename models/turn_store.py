"""The store a turn's preparation reads and its tools write, on Postgres (`handlers.store.TurnStore`).

handlers/ never queries Postgres: the worker hands a `PostgresTurnStore` to `build_turn_input`, which
takes from it the session's history rows (`models.history`), its knowledge bases, a search bound to
the session (its own tenant's knowledge bases only, `models.search`) and the recorder of paid tool
calls (`record_paid_call`, below).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from models.db import session_scope
from models.history import SessionHistory, session_history
from models.knowledge import session_knowledge_bases
from models.search import SearchHit, search
from models.tables import PaidToolCall, Turn, TurnStatus

__all__ = ["PostgresTurnStore", "record_paid_call"]


class PostgresTurnStore:
    """chatq's store: every method reads or writes Postgres (errors are SQLAlchemy's, unchanged)."""

    def history(self, session_id: uuid.UUID, reply_to: int | None) -> AbstractContextManager[SessionHistory]:
        """The session's history rows before `reply_to` (`models.history.session_history`)."""
        return session_history(session_id, reply_to)

    def knowledge_bases(self, session_id: uuid.UUID) -> list[str]:
        """Names of the knowledge bases of its tenant attached to the session."""
        return session_knowledge_bases(session_id)

    def searcher(self, session_id: uuid.UUID, knowledge_bases: Sequence[str]) -> Callable[[str, int], list[SearchHit]]:
        """`search(query, limit)` over these knowledge bases, within the session's own tenant."""
        names = tuple(knowledge_bases)

        def search_session(query: str, limit: int) -> list[SearchHit]:
            # The session's own tenant's knowledge bases only, whatever names the caller holds.
            return search(names, query, limit=limit, session_id=session_id)

        return search_session

    def recorder(self) -> Callable[..., bool]:
        """The recorder of paid tool calls (`record_paid_call`)."""
        return record_paid_call


def _running_turn(db: Any, session_id: uuid.UUID) -> tuple[uuid.UUID | None, int | None]:
    """The session's running turn and its attempt: turns of a session run one at a time."""
    row = db.execute(
        select(Turn.id, Turn.attempts)
        .where(Turn.session_id == session_id, Turn.status == TurnStatus.RUNNING)
        .order_by(Turn.position)
        .limit(1)
    ).first()
    return (row.id, int(row.attempts)) if row is not None else (None, None)


def record_paid_call(
    *,
    tool_name: str,
    tool_call_id: str,
    invocation_id: uuid.UUID,
    session_id: uuid.UUID | None,
    turn_id: uuid.UUID | None,
    attempt: int | None,
    units: int,
    unit_price: Decimal,
) -> bool:
    """Store one paid tool call in `paid_tool_calls`; True if stored now, False if already recorded.

    `invocation_id` + `tool_call_id` is the key (`uq_paid_tool_calls_invocation_call`). Without
    `turn_id`, the session's running turn (and its attempt) is taken: a session runs one turn at a
    time, so that is the turn the call belongs to. The cost is `units * unit_price`.
    """
    with session_scope() as db:
        if turn_id is None and session_id is not None:
            turn_id, running_attempt = _running_turn(db, session_id)
            attempt = attempt if attempt is not None else running_attempt
        stored = db.execute(
            pg_insert(PaidToolCall)
            .values(
                invocation_id=invocation_id,
                tool_call_id=tool_call_id[:255],
                tool_name=tool_name[:64],
                session_id=session_id,
                turn_id=turn_id,
                attempt=attempt,
                units=units,
                unit_price=unit_price,
                cost=unit_price * units,
            )
            .on_conflict_do_nothing(constraint="uq_paid_tool_calls_invocation_call")
            .returning(PaidToolCall.id)
        ).scalar_one_or_none()
    return stored is not None

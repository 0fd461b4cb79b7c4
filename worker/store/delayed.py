"""Delayed turns in the store: stored `delayed` (`insert_delayed_turn`) and released when due
(`release_due`), both statements of `worker.store.transition_sql` (the module that owns every
transition of a turn's status).

A delayed turn holds no place in its session's order until it is due: no position, no user message
(its input waits in `turns.pending_input`). `release_due` moves each due one to `queued` with its
session's next position and stores its user message, in one statement that any number of workers
run at once (SKIP LOCKED: each turn is released once). The caller sends the released turns' task
messages after the commit; a send that is lost is found by the sweep like any queued turn's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, exists, select
from sqlalchemy.orm import Session

from models.db import autocommit_scope
from models.tables import MESSAGE_POSITION_STRIDE, Turn
from worker.errors import SessionNotFound, TurnExists
from worker.store import transition_sql as sql
from worker.store.turns import NextTurn, check_reply_to, check_tenant

__all__ = ["DEFAULT_RELEASE_LIMIT", "Released", "insert_delayed_turn", "release_due"]

DEFAULT_RELEASE_LIMIT = 100
"""Due turns whose sessions one `release_due` statement takes (it releases every due turn of those
sessions, so it may release more); the rest wait for the next statement."""


@dataclass(frozen=True, kw_only=True)
class Released(NextTurn):
    """A delayed turn `release_due` queued: its task message (`to_message`), queue and new position."""

    position: int
    """The position it took in its session."""


def insert_delayed_turn(
    db: Session | Connection,
    request: NextTurn,
    *,
    run_at: datetime,
    webhook_url: str | None,
) -> None:
    """Store a turn as `delayed` until `run_at` (timezone-aware), its input kept for when it is due.

    Raises SessionNotFound, TenantMismatch (the request names a tenant the session is not), or
    TurnExists when the id is taken.
    """
    check_reply_to(db, request.session_id, request.reply_to)
    inserted = db.execute(
        sql.INSERT_DELAYED,
        {
            "turn_id": request.turn_id,
            "session_id": request.session_id,
            "queue": request.queue,
            "reply_to": request.reply_to,
            "webhook_url": webhook_url,
            "run_at": run_at,
            "pending_input": {"content": request.content, "images": list(request.images) if request.images else None},
            "tenant": request.tenant,
        },
    ).scalar_one_or_none()
    if inserted is not None:
        return
    check_tenant(db, request.session_id, request.tenant)
    if db.execute(select(exists().where(Turn.id == request.turn_id))).scalar_one():
        raise TurnExists(f"turn {request.turn_id} already exists")
    raise SessionNotFound(f"session {request.session_id} does not exist")


def release_due(*, engine: Engine, now: datetime | None = None, limit: int = DEFAULT_RELEASE_LIMIT) -> list[Released]:
    """Queue the delayed turns due at `now` (None: the statement's start, the database's clock) of the
    sessions of the first `limit` of them that no other statement holds; one statement.

    Returns the released turns, committed: the caller sends their task messages.
    """
    with autocommit_scope(engine) as db:
        rows = (
            db.execute(sql.RELEASE_DUE, {"now": now, "limit": limit, "stride": MESSAGE_POSITION_STRIDE})
            .mappings()
            .all()
        )
    return [
        Released(
            turn_id=row["id"],
            session_id=row["session_id"],
            queue=row["queue"],
            content=row["content"],
            images=tuple(row["images"]) if row["images"] else None,
            reply_to=row["reply_to"],
            tenant=row["tenant"],
            position=int(row["position"]),
        )
        for row in rows
    ]

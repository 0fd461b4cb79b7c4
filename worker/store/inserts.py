"""Inserting turns as `queued` (one of `worker.store.claims`' transitions, kept here for its size):
the producer's (`insert_turn`) and a turn that arrived only as a task message (`store_turn`, through
`worker.store.claims.claim_message`), each one statement of `worker.store.transition_sql`.
`worker.store.claims` re-exports them (a batch's rows, written as they are, stay there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, exists, select
from sqlalchemy.orm import Session

from models.db import autocommit_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatSession, DeletedSession, Turn
from worker.errors import SessionDeleted, SessionNotFound, TurnExists
from worker.payload import TurnRequest
from worker.store import transition_sql as sql
from worker.store.turns import check_reply_to, check_tenant

__all__ = ["ROUNDS", "STORED", "InsertedTurn", "ensure_turn", "insert_queued_turn", "insert_turn", "store_turn"]

log = logging.getLogger(__name__)

ROUNDS = 4
"""Statements `store_turn` runs at most while the session changes under it (created or deleted)."""


@dataclass(frozen=True, kw_only=True)
class InsertedTurn:
    """What `insert_queued_turn` stored."""

    position: int
    """The turn's position in its session."""
    tenant: str | None
    """Its session's tenant (None: none), read from the session row the insert updates anyway."""


def insert_turn(db: Session | Connection, request: TurnRequest, *, queue: str) -> int:
    """`insert_queued_turn`'s position."""
    return insert_queued_turn(db, request, queue=queue).position


def insert_queued_turn(db: Session | Connection, request: TurnRequest, *, queue: str) -> InsertedTurn:
    """Add a queued turn and its user message; returns the turn's position and its session's tenant.

    One statement (take the session's next position, insert the turn and its user message), so it
    is atomic also in autocommit; taking the position locks the session row. Raises SessionNotFound,
    TenantMismatch when the request names a tenant the session is not (nothing stored), or TurnExists
    when the id is taken (then no position is used, except by a duplicate racing this very insert).
    """
    check_reply_to(db, request.session_id, request.reply_to)
    values = {
        "session_id": request.session_id,
        "turn_id": request.turn_id,
        "queue": queue,
        "reply_to": request.reply_to,
        "content": request.content,
        "images": list(request.images) if request.images else None,
        "stride": MESSAGE_POSITION_STRIDE,
        "tenant": request.tenant,
    }
    for _ in range(2):
        row = db.execute(sql.INSERT_TURN, values).one()
        if row.position is not None:
            return InsertedTurn(position=int(row.position), tenant=row.tenant)
        # Nothing inserted. The statement's snapshot is older than the session row lock it may
        # have waited for: a session deleted meanwhile still "exists" in it, and the turn id may
        # have been taken or freed since. A new statement sees what committed (read committed).
        turn_exists, session_exists = db.execute(
            select(exists().where(Turn.id == request.turn_id), exists().where(ChatSession.id == request.session_id))
        ).one()
        # Before TurnExists: a resubmission into another tenant's session is refused, not accepted.
        check_tenant(db, request.session_id, request.tenant)
        if turn_exists:
            raise TurnExists(f"turn {request.turn_id} already exists")
        if not session_exists:
            raise SessionNotFound(f"session {request.session_id} does not exist")
        # Neither: a duplicate of this id rolled back (or was deleted) meanwhile; insert again.
    raise TurnExists(f"turn {request.turn_id} already exists")


STORED = object()
"""`store_turn`'s answer for a turn it stored now."""


def store_turn(request: TurnRequest, *, queue: str, engine: Engine, max_deliveries: int) -> Any:
    """Run `ENSURE_TURN`: `STORED`, the `WHY_NOT_CLAIMED` row of a turn that exists, or None when
    the session kept changing under every round.

    Committed durably: the message is acknowledged only after the turn ends, so a turn whose insert
    is lost comes again. Raises SessionDeleted or InvalidTurn (TenantMismatch: the message names a
    tenant its existing session is not; see `worker.store.claims.claim_message`).
    """
    digest = DeletedSession.digest_of(request.session_id)
    values = {
        "session_id": request.session_id,
        "turn_id": request.turn_id,
        "digest": digest,
        "queue": queue,
        "reply_to": request.reply_to,
        "content": request.content,
        "images": list(request.images) if request.images else None,
        "stride": MESSAGE_POSITION_STRIDE,
        "max_deliveries": max_deliveries,
        "tenant": request.tenant,
    }
    with autocommit_scope(engine) as db:
        for _ in range(ROUNDS):
            row = db.execute(sql.ENSURE_TURN, values).one()
            if row.position is not None:
                return STORED
            if row.why is not None:
                return row
            # Nothing stored and no turn in the statement's snapshot, which is older than a row it
            # may have waited for (the session created or deleted meanwhile). Say why, or go again.
            check_reply_to(db, request.session_id, request.reply_to)
            check_tenant(db, request.session_id, request.tenant)
            session_exists, deleted = db.execute(
                select(
                    exists().where(ChatSession.id == request.session_id),
                    exists().where(DeletedSession.digest == digest),
                )
            ).one()
            if deleted and not session_exists:
                raise SessionDeleted(f"session {request.session_id} was deleted")
    log.warning("turn %s session %s: the session kept changing; not stored yet", request.turn_id, request.session_id)
    return None


def ensure_turn(request: TurnRequest, *, queue: str, engine: Engine, max_deliveries: int = 1) -> bool:
    """Store a turn that arrived only through Redis (`store_turn`); True if it was stored now.

    `max_deliveries` only shapes the why-not row this answer does not use.
    """
    return store_turn(request, queue=queue, engine=engine, max_deliveries=max_deliveries) is STORED

"""Turn rows in Postgres: creating turns, finding the next one to run, the sweeper's search, and
which crashes of a turn's workers count against it (poison).

Postgres is the source of truth. Positions are taken under the session row lock, so concurrent
submits never collide; claiming and ending turns live in `worker.claims`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import (
    BigInteger,
    Connection,
    RowMapping,
    Uuid,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from chatq.settings import get_settings
from handlers.base import SessionInfo
from models.db import connection_scope, session_scope
from models.tables import ACTIVE_STATUSES, MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus
from worker.errors import InvalidTurn, SessionNotFound, TurnExists
from worker.leases import renewal_interval
from worker.payload import TurnRequest

log = logging.getLogger(__name__)


def session_info(row: ChatSession) -> SessionInfo:
    """A detached, immutable view of a session row for handlers."""
    return SessionInfo(
        id=row.id,
        agent_framework=row.agent_framework,
        model=row.model,
        system_prompt=row.system_prompt,
        metadata_=dict(row.metadata_ or {}),
    )


def ensure_session(db: Session, session_id: uuid.UUID) -> None:
    """Create a session with the defaults if it does not exist (turns sent straight through Redis).

    The model is left NULL like that of any session created without one: the worker's default.
    """
    db.execute(
        pg_insert(ChatSession)
        .values(id=session_id, agent_framework="langgraph", model=None, metadata_={})
        .on_conflict_do_nothing(index_elements=[ChatSession.id])
    )


def lock_session(db: Session, session_id: uuid.UUID) -> ChatSession:
    """Lock a session row for this transaction (FOR NO KEY UPDATE: foreign-key checks still pass)."""
    row = db.execute(
        select(ChatSession).where(ChatSession.id == session_id).with_for_update(key_share=True)
    ).scalar_one_or_none()
    if row is None:
        raise SessionNotFound(f"session {session_id} does not exist")
    return row


def check_reply_to(db: Session | Connection, session_id: uuid.UUID, reply_to: int | None) -> None:
    """reply_to must be a user message of the same session."""
    if reply_to is None:
        return
    role = db.execute(
        select(ChatMessage.role).where(ChatMessage.id == reply_to, ChatMessage.session_id == session_id)
    ).scalar_one_or_none()
    if role is None:
        raise InvalidTurn(f"reply_to {reply_to} is not a message of session {session_id}")
    if role != "user":
        raise InvalidTurn(f"reply_to {reply_to} is a {role} message; it must be a user message")


_INSERT_TURN = text(
    """
    WITH taken AS (
        -- Not for a turn id that exists: outside a transaction the position could not be given back.
        UPDATE chat_sessions SET next_turn_position = next_turn_position + 1
        WHERE id = :session_id AND NOT EXISTS (SELECT 1 FROM turns WHERE id = :turn_id)
        RETURNING next_turn_position - 1 AS position
    ),
    turn AS (
        INSERT INTO turns (id, session_id, position, status, queue, reply_to)
        SELECT :turn_id, :session_id, taken.position, 'queued', :queue, :reply_to FROM taken
        ON CONFLICT (id) DO NOTHING
        RETURNING id, position
    ),
    message AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, images)
        SELECT :session_id, turn.id, turn.position * :stride, 'user', :content, :images FROM turn
    )
    SELECT (SELECT position FROM turn) AS position,
           EXISTS (SELECT 1 FROM chat_sessions WHERE id = :session_id) AS session_exists
    """
).bindparams(bindparam("images", type_=JSONB), bindparam("reply_to", type_=BigInteger))


def insert_turn(db: Session | Connection, request: TurnRequest, *, queue: str) -> int:
    """Add a queued turn and its user message; returns the turn's position.

    One statement (take the session's next position, insert the turn and its user message), so it
    is atomic also in autocommit; taking the position locks the session row. Raises SessionNotFound,
    or TurnExists when the id is taken (then no position is used, except by a duplicate racing this
    very insert).
    """
    check_reply_to(db, request.session_id, request.reply_to)
    row = db.execute(
        _INSERT_TURN,
        {
            "session_id": request.session_id,
            "turn_id": request.turn_id,
            "queue": queue,
            "reply_to": request.reply_to,
            "content": request.content,
            "images": list(request.images) if request.images else None,
            "stride": MESSAGE_POSITION_STRIDE,
        },
    ).one()
    if row.position is not None:
        return int(row.position)
    if not row.session_exists:
        raise SessionNotFound(f"session {request.session_id} does not exist")
    raise TurnExists(f"turn {request.turn_id} already exists")


def ensure_turn(request: TurnRequest, *, queue: str) -> bool:
    """Insert a turn that arrived only through Redis; True if it was inserted now."""
    try:
        with session_scope() as db:
            ensure_session(db, request.session_id)
            insert_turn(db, request, queue=queue)
    except TurnExists:
        return False
    return True


def turn_exists(turn_id: uuid.UUID) -> bool:
    """Whether a turn row exists."""
    with session_scope() as db:
        return db.get(Turn, turn_id) is not None


@dataclass(frozen=True, kw_only=True)
class NextTurn(TurnRequest):
    """The turn that may run next in a session: its task message (`to_message`) and its queue."""

    queue: str
    """The queue to send it on."""

    @classmethod
    def from_row(cls, row: RowMapping) -> NextTurn:
        """From a row with the columns `_NEXT_RUNNABLE` returns (id, session_id, queue, reply_to, content, images)."""
        return cls(
            turn_id=row["id"],
            session_id=row["session_id"],
            queue=row["queue"],
            content=row["content"],
            images=tuple(row["images"]) if row["images"] else None,
            reply_to=row["reply_to"],
        )


_NEXT_RUNNABLE = text(
    """
    UPDATE turns t SET enqueued_at = clock_timestamp()
    FROM chat_messages m
    WHERE t.id = (
            SELECT id FROM turns
            WHERE session_id = :session_id AND status IN ('queued', 'running')
            ORDER BY position LIMIT 1
        )
      AND t.status = 'queued'
      AND m.turn_id = t.id AND m.role = 'user'
    RETURNING t.id, t.session_id, t.queue, t.reply_to, m.content, m.images
    """
)


def next_in(db: Session | Connection, session_id: uuid.UUID) -> NextTurn | None:
    """The session's head turn if it is queued (nothing runs before it), marked as sent now."""
    row = db.execute(_NEXT_RUNNABLE, {"session_id": session_id}).mappings().one_or_none()
    return None if row is None else NextTurn.from_row(row)


def next_runnable(session_id: uuid.UUID) -> NextTurn | None:
    """`next_in` in a transaction of its own."""
    with connection_scope() as db:
        return next_in(db, session_id)


def _next_turn(db: Session, turn: Turn) -> NextTurn:
    user = db.execute(
        select(ChatMessage.content, ChatMessage.images).where(
            ChatMessage.turn_id == turn.id, ChatMessage.role == "user"
        )
    ).one_or_none()
    return NextTurn(
        turn_id=turn.id,
        session_id=turn.session_id,
        queue=turn.queue,
        content=user.content if user is not None else "",
        images=tuple(user.images) if user is not None and user.images else None,
        reply_to=turn.reply_to,
    )


def stale_turns(
    *,
    grace_seconds: float,
    in_queue: Callable[[Sequence[uuid.UUID]], set[uuid.UUID]] | None = None,
    patience: float = 10.0,
    limit: int = 2000,
) -> tuple[list[NextTurn], list[uuid.UUID]]:
    """For the sweeper: runnable queued turns not sent for `grace_seconds`, and turns whose lease expired.

    `in_queue` tells which queued turns still have their message waiting in Redis: those are only
    slow (workers are busy), not lost, and are re-sent only after `patience` times the grace, so a
    long backlog is not multiplied by every sweep. Expired leases are released back to `queued`
    here (so the re-sent message can claim them), and everything returned is marked as sent now,
    so overlapping sweeps do not send twice.
    """
    with session_scope() as db:
        now = db.execute(select(func.now())).scalar_one()
        earlier = Turn.__table__.alias("earlier")
        no_earlier_active = ~exists().where(
            earlier.c.session_id == Turn.session_id,
            earlier.c.position < Turn.position,
            earlier.c.status.in_(ACTIVE_STATUSES),
        )
        rows = (
            db.execute(
                select(Turn)
                .where(
                    or_(
                        and_(
                            Turn.status == TurnStatus.QUEUED,
                            Turn.enqueued_at < now - timedelta(seconds=grace_seconds),
                            no_earlier_active,
                        ),
                        and_(Turn.status == TurnStatus.RUNNING, Turn.lease_expires_at < now),
                    )
                )
                .order_by(Turn.created_at)
                .limit(limit)
                .with_for_update(skip_locked=True, of=Turn)
            )
            .scalars()
            .all()
        )
        waiting = {t.id for t in rows if t.status is TurnStatus.QUEUED}
        queued_in_redis = in_queue(list(waiting)) if in_queue and waiting else set()
        # Floor: a tiny grace (tests, impatient operators) must still not re-send a backlog every sweep.
        patience_cutoff = now - timedelta(seconds=max(grace_seconds * patience, 30.0))
        stopped = [turn.id for turn in rows if turn.status is TurnStatus.RUNNING]
        if stopped:
            # All in one statement, before any lease is cleared: turns that stopped together see each other.
            record_stops(db, stopped)
        resend: list[NextTurn] = []
        expired: list[uuid.UUID] = []
        for turn in rows:
            if turn.id in queued_in_redis and turn.enqueued_at is not None and turn.enqueued_at > patience_cutoff:
                continue
            if turn.status is TurnStatus.RUNNING:
                expired.append(turn.id)
                turn.status = TurnStatus.QUEUED
                turn.lease_token = None
                turn.lease_expires_at = None
            turn.enqueued_at = now
            resend.append(_next_turn(db, turn))
        return resend, expired


_RECORD_STOPS = text(
    """
    UPDATE turns t
    SET stopped_worker = t.worker,
        stopped_at = t.lease_expires_at,
        lone_crashes = t.lone_crashes + CASE WHEN t.lease_expires_at IS NULL OR EXISTS (
            -- Another turn whose lease on the same worker stopped being renewed at the same moment:
            -- still running with it, or already moved on (its stop recorded).
            SELECT 1 FROM turns o
            WHERE o.id <> t.id
              AND ((o.status = 'running' AND o.worker = t.worker
                    AND o.lease_expires_at BETWEEN t.lease_expires_at - make_interval(secs => :window)
                                               AND t.lease_expires_at + make_interval(secs => :window))
                   OR (o.stopped_worker = t.worker
                       AND o.stopped_at BETWEEN t.lease_expires_at - make_interval(secs => :window)
                                            AND t.lease_expires_at + make_interval(secs => :window)))
        ) THEN 0 ELSE 1 END,
        crash_hosts = CASE WHEN h.host = ANY(t.crash_hosts) THEN t.crash_hosts ELSE t.crash_hosts || h.host END
    FROM (
        -- A Celery node name is `name@host`; a name without `@` is taken as its own host.
        SELECT id, substring(coalesce(worker, '') FROM position('@' IN coalesce(worker, '')) + 1) AS host
        FROM turns WHERE id = ANY(:turn_ids)
    ) h
    WHERE t.id = h.id AND t.status = 'running'
    """
).bindparams(bindparam("turn_ids", type_=ARRAY(Uuid)))


def record_stops(db: Session, turn_ids: Sequence[uuid.UUID]) -> None:
    """Record that the workers running these turns stopped: their leases ran out unrenewed.

    The caller holds the turns' row locks, has seen them `running` with an expired lease and is
    about to move them on. One statement for all of them, so turns of one worker handled together
    see each other as they were; each turn keeps its stop (`stopped_worker`, `stopped_at`), so a
    turn handled later still finds those moved before it. The window is a renewal interval either
    side, and as much again for a slow renewal query: a live worker's leases sit about a lease
    length ahead, well outside it.
    """
    window = 1.5 * renewal_interval(get_settings().lease_seconds)
    db.execute(_RECORD_STOPS, {"turn_ids": list(turn_ids), "window": window})


def poison_reason(turn: Turn, *, max_deliveries: int) -> str | None:
    """Why a turn whose workers kept stopping is failed as poison, or None while it is not.

    `deliveries` counts the crashed deliveries since the turn's last clean end. A crash counts
    against the turn only when the turn is its likely cause: it was the only turn running on the
    worker that stopped (`lone_crashes`), or it stopped workers on more than one host (then every
    crash counts). A turn that merely ran beside others on a worker that died is not counted.
    `worker.claims._FAST_CLAIM` claims only turns for which this is None: keep the two agreeing.
    """
    limit = f"(CHATQ_MAX_DELIVERIES={max_deliveries})"
    if turn.lone_crashes >= max_deliveries:
        if turn.lone_crashes == turn.deliveries:
            times = f"each of the {turn.deliveries} times its worker stopped"
        else:
            times = f"{turn.lone_crashes} of the {turn.deliveries} times its worker stopped"
        return f"the turn was abandoned: it was the only turn running {times} {limit}"
    if len(turn.crash_hosts) >= 2 and turn.deliveries >= max_deliveries:
        return (
            f"the turn was abandoned: it stopped workers on {len(turn.crash_hosts)} hosts, "
            f"{turn.deliveries} times in all {limit}"
        )
    return None


_RECOUNT_HISTORY_TOTALS = text(
    """
    UPDATE turns t
    SET history_turns = totals.turns, history_messages = totals.messages
    FROM (
        SELECT s.id,
               count(*) OVER w AS turns,
               sum(coalesce(m.messages, 0)) OVER w AS messages
        FROM turns s
        LEFT JOIN (SELECT turn_id, count(*) AS messages FROM chat_messages GROUP BY turn_id) m ON m.turn_id = s.id
        WHERE s.session_id = :session_id AND s.status = 'succeeded'
        WINDOW w AS (PARTITION BY s.session_id ORDER BY s.position)
    ) totals
    WHERE t.id = totals.id
    """
)


def recount_history_totals(db: Session | Connection, session_id: uuid.UUID) -> None:
    """Set the running history totals of a session's succeeded turns from its rows.

    `complete_turn` keeps them as turns succeed; this is for rows written another way (imports,
    test fixtures, the benchmarks' seeded sessions), as migration 0003 did for existing ones.
    """
    db.execute(_RECOUNT_HISTORY_TOTALS, {"session_id": session_id})

"""Claiming and ending turns: who runs a turn, and the guarded writes that end it.

A claim takes a `queued` turn (or a `running` one whose lease expired) only when no earlier turn
of its session is still active, under the session row lock; ending a turn requires the claim's
`lease_token`, so a worker that lost its lease (a zombie) cannot write a second reply.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, select, text, update
from sqlalchemy.dialects.postgresql import JSONB

from chatq.settings import get_settings
from handlers.base import AgentMessage, SessionInfo, Usage
from models.db import autocommit_scope, connection_scope, session_scope
from models.tables import ACTIVE_STATUSES, MESSAGE_POSITION_STRIDE, ChatMessage, Turn, TurnStatus
from worker.errors import InvalidTurn
from worker.payload import session_conflict, task_message
from worker.turns import NextTurn, lock_session, next_in, poison_reason, record_stops, session_info

log = logging.getLogger(__name__)


class ClaimStatus(enum.StrEnum):
    """What a claim attempt found."""

    CLAIMED = "claimed"
    NOT_FOUND = "not_found"
    FINISHED = "finished"
    BUSY = "busy"
    BLOCKED = "blocked"
    POISONED = "poisoned"
    CANCELLED = "cancelled"
    CONFLICT = "conflict"


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A turn this worker now runs, with everything the run needs."""

    turn_id: uuid.UUID
    """The turn (= task id)."""
    session: SessionInfo
    """The session, detached from the database."""
    position: int
    """The turn's position in its session."""
    attempt: int
    """The handler invocation this claim starts (1 for the first)."""
    deliveries: int
    """How many times the turn has been claimed, this one included."""
    lease_token: uuid.UUID
    """Proof of ownership; finishing writes require it."""
    content: str
    """The user's message."""
    images: tuple[str, ...] | None
    """Images attached to the user's message."""
    reply_to: int | None
    """The user message being answered, for regenerate/edit."""
    queue: str
    """The queue the turn travels on."""

    def to_message(self) -> dict[str, Any]:
        """The turn's `chatq.run_turn` message, to send it again."""
        return task_message(
            turn_id=self.turn_id,
            session_id=self.session.id,
            content=self.content,
            images=self.images,
            reply_to=self.reply_to,
        )


@dataclass(frozen=True, kw_only=True)
class ClaimResult:
    """The outcome of `claim_turn`."""

    status: ClaimStatus
    """What the claim found."""
    claim: Claim | None = None
    """Set when `status` is CLAIMED."""
    retry_after: float | None = None
    """For BUSY: seconds until the current lease runs out."""
    error: str | None = None
    """For POISONED: the error stored on the turn; for CONFLICT: what conflicts."""
    attempt: int = 0
    """For POISONED and CANCELLED: the turn's attempts so far."""


_FAST_CLAIM = text(
    """
    WITH relaxed AS (
        -- This statement's commit does not wait for the WAL flush (see `claim_turn`).
        SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit
    ),
    locked AS (
        SELECT s.id, s.agent_framework, s.model, s.system_prompt, s.metadata
        FROM chat_sessions s
        WHERE s.id = (SELECT session_id FROM turns WHERE id = :turn_id)
        FOR NO KEY UPDATE
    ),
    claimed AS (
        UPDATE turns t
        SET status = 'running',
            attempts = t.attempts + 1,
            deliveries = t.deliveries + 1,
            lease_token = :token,
            lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
            worker = :worker,
            started_at = coalesce(t.started_at, clock_timestamp())
        FROM locked
        WHERE t.id = :turn_id
          AND t.session_id = locked.id
          AND t.session_id = coalesce(CAST(:session_id AS uuid), t.session_id)
          AND t.status = 'queued'
          AND NOT t.cancel_requested
          -- Not poison: the negation of `worker.turns.poison_reason`.
          AND t.lone_crashes < :max_deliveries
          AND NOT (cardinality(t.crash_hosts) >= 2 AND t.deliveries >= :max_deliveries)
          AND NOT EXISTS (
              SELECT 1 FROM turns e
              WHERE e.session_id = t.session_id AND e.position < t.position AND e.status IN ('queued', 'running')
          )
        RETURNING t.id, t.session_id, t.position, t.attempts, t.deliveries, t.reply_to, t.queue
    )
    SELECT claimed.*, locked.agent_framework, locked.model, locked.system_prompt, locked.metadata,
           m.content, m.images,
           ARRAY(
               SELECT kb.name FROM session_knowledge_bases skb
               JOIN knowledge_bases kb ON kb.id = skb.knowledge_base_id
               WHERE skb.session_id = claimed.session_id
               ORDER BY kb.name
           ) AS knowledge_bases
    FROM claimed
    JOIN locked ON true
    JOIN relaxed ON true
    JOIN chat_messages m ON m.turn_id = claimed.id AND m.role = 'user'
    """
).bindparams(bindparam("session_id", value=None))  # no session given: any session


def claim_turn(turn_id: uuid.UUID, *, worker: str, session_id: uuid.UUID | None = None) -> ClaimResult:
    """Take a turn for running, if it is this turn's go. See the module docstring.

    With `session_id` (the session a message names), a turn stored in another session is not
    claimed: the result is CONFLICT and the turn is left as it is.
    """
    settings = get_settings()
    token = uuid.uuid4()
    # One statement: atomic on its own, so no transaction around it. Its commit is asynchronous
    # (`synchronous_commit = off` for this statement only): a claim lost to a Postgres crash only
    # runs the turn again, since ending it needs the lost lease token, and the durable commit of
    # the reply flushes the claim with it. That is 0.3 ms off every turn's start here.
    with autocommit_scope() as db:
        row = (
            db.execute(
                _FAST_CLAIM,
                {
                    "turn_id": turn_id,
                    "session_id": session_id,
                    "token": token,
                    "lease_seconds": settings.lease_seconds,
                    "worker": worker[:255],
                    "max_deliveries": settings.max_deliveries,
                },
            )
            .mappings()
            .one_or_none()
        )
    if row is not None:
        session = SessionInfo(
            id=row["session_id"],
            agent_framework=row["agent_framework"],
            model=row["model"],
            system_prompt=row["system_prompt"],
            metadata_=dict(row["metadata"] or {}),
            knowledge_bases=tuple(row["knowledge_bases"]),
        )
        claim = Claim(
            turn_id=turn_id,
            session=session,
            position=row["position"],
            attempt=row["attempts"],
            deliveries=row["deliveries"],
            lease_token=token,
            content=row["content"],
            images=tuple(row["images"]) if row["images"] else None,
            reply_to=row["reply_to"],
            queue=row["queue"],
        )
        return ClaimResult(status=ClaimStatus.CLAIMED, claim=claim)
    return _claim_slow(turn_id, worker=worker, expected_session=session_id)


def _claim_slow(turn_id: uuid.UUID, *, worker: str, expected_session: uuid.UUID | None = None) -> ClaimResult:
    """The claim with every case spelled out (see `_FAST_CLAIM`)."""
    settings = get_settings()
    with session_scope() as db:
        session_id = db.execute(select(Turn.session_id).where(Turn.id == turn_id)).scalar_one_or_none()
        if session_id is None:
            return ClaimResult(status=ClaimStatus.NOT_FOUND)
        if expected_session is not None and session_id != expected_session:
            conflict = session_conflict(turn_id, stored_session=session_id, given_session=expected_session)
            return ClaimResult(status=ClaimStatus.CONFLICT, error=conflict)
        # Serialise claims per session: two turns of a session can never both pass the check below.
        session_row = lock_session(db, session_id)
        turn = db.execute(select(Turn).where(Turn.id == turn_id).with_for_update()).scalar_one()
        if turn.status not in (TurnStatus.QUEUED, TurnStatus.RUNNING):
            return ClaimResult(status=ClaimStatus.FINISHED)
        # The wall clock, not now() (the transaction's start): this transaction may have waited for
        # the session lock while the previous turn finished, and started_at must not precede that.
        now = db.execute(select(func.clock_timestamp())).scalar_one()
        if turn.status is TurnStatus.RUNNING and turn.lease_expires_at is not None and turn.lease_expires_at > now:
            return ClaimResult(status=ClaimStatus.BUSY, retry_after=(turn.lease_expires_at - now).total_seconds())
        earlier_active = db.execute(
            select(
                exists().where(
                    Turn.session_id == session_id,
                    Turn.position < turn.position,
                    Turn.status.in_(ACTIVE_STATUSES),
                )
            )
        ).scalar_one()
        if earlier_active:
            return ClaimResult(status=ClaimStatus.BLOCKED)
        if turn.status is TurnStatus.RUNNING:
            # Its worker stopped: recorded before the turn moves on, whichever way (see `record_stops`).
            record_stops(db, [turn_id])
            db.refresh(turn)
        if turn.cancel_requested:
            turn.status = TurnStatus.CANCELLED
            turn.finished_at = now
            turn.lease_token = None
            turn.lease_expires_at = None
            return ClaimResult(status=ClaimStatus.CANCELLED, attempt=turn.attempts)
        poison = poison_reason(turn, max_deliveries=settings.max_deliveries)
        if poison is not None:
            turn.status = TurnStatus.FAILED
            turn.error = poison
            turn.finished_at = now
            turn.lease_token = None
            turn.lease_expires_at = None
            return ClaimResult(status=ClaimStatus.POISONED, error=turn.error, attempt=turn.attempts)
        user = db.execute(
            select(ChatMessage.content, ChatMessage.images).where(
                ChatMessage.turn_id == turn_id, ChatMessage.role == "user"
            )
        ).one()
        token = uuid.uuid4()
        turn.status = TurnStatus.RUNNING
        turn.attempts += 1
        turn.deliveries += 1
        turn.lease_token = token
        turn.lease_expires_at = now + timedelta(seconds=settings.lease_seconds)
        turn.worker = worker[:255]
        if turn.started_at is None:
            turn.started_at = now
        claim = Claim(
            turn_id=turn_id,
            session=session_info(session_row),
            position=turn.position,
            attempt=turn.attempts,
            deliveries=turn.deliveries,
            lease_token=token,
            content=user.content,
            images=tuple(user.images) if user.images else None,
            reply_to=turn.reply_to,
            queue=turn.queue,
        )
        return ClaimResult(status=ClaimStatus.CLAIMED, claim=claim)


def _owned(claim: Claim) -> Any:
    return and_(Turn.id == claim.turn_id, Turn.status == TurnStatus.RUNNING, Turn.lease_token == claim.lease_token)


@dataclass(frozen=True, kw_only=True)
class Finished:
    """The outcome of ending an owned turn."""

    stored: bool
    """False when the lease was lost: nothing was written."""
    next_turn: NextTurn | None = None
    """The session's next queued turn, to send now (found in the same transaction)."""


_COMPLETE = text(
    """
    WITH prior AS (
        -- Turns of a session end in position order, so the last succeeded one before this turn
        -- holds the session's totals so far (NULL only if an older chatq stored it: counted then).
        SELECT history_turns, history_messages FROM turns
        WHERE session_id = :session_id AND status = 'succeeded' AND position < :position
        ORDER BY position DESC LIMIT 1
    ),
    done AS (
        UPDATE turns
        SET status = 'succeeded', prompt_tokens = :prompt_tokens, completion_tokens = :completion_tokens,
            total_tokens = :total_tokens, error = NULL, lease_token = NULL, lease_expires_at = NULL,
            finished_at = clock_timestamp(),
            -- the prior turn's totals, or a count when it has none (also 0 when there is no prior)
            history_turns = 1 + coalesce(
                (SELECT history_turns FROM prior),
                (SELECT count(*) FROM turns p
                 WHERE p.session_id = :session_id AND p.status = 'succeeded' AND p.position < :position)
            ),
            -- this turn's own messages: those stored before it ran (its user message) and the reply
            history_messages = (SELECT count(*) FROM chat_messages WHERE turn_id = :turn_id)
                + jsonb_array_length(:messages)
                + coalesce(
                    (SELECT history_messages FROM prior),
                    (SELECT count(*) FROM chat_messages m JOIN turns p ON p.id = m.turn_id
                     WHERE p.session_id = :session_id AND p.status = 'succeeded' AND p.position < :position)
                )
        WHERE id = :turn_id AND status = 'running' AND lease_token = :token
        RETURNING id, session_id, position
    ),
    stored AS (
        INSERT INTO chat_messages (session_id, turn_id, position, role, content, tool_calls, tool_call_id, citations)
        SELECT done.session_id, done.id, done.position * :stride + m.offset, m.role, m.content,
               m.tool_calls, m.tool_call_id, m.citations
        FROM done, jsonb_to_recordset(:messages)
            AS m("offset" int, role text, content text, tool_calls jsonb, tool_call_id text, citations jsonb)
    ),
    following AS (
        -- next_in's statement; this statement's snapshot still sees the turn above as running.
        UPDATE turns t SET enqueued_at = clock_timestamp()
        FROM chat_messages m
        WHERE EXISTS (SELECT 1 FROM done)
          AND t.id = (
                SELECT id FROM turns
                WHERE session_id = :session_id AND status IN ('queued', 'running') AND id <> :turn_id
                ORDER BY position LIMIT 1
            )
          AND t.status = 'queued'
          AND m.turn_id = t.id AND m.role = 'user'
        RETURNING t.id, t.session_id, t.queue, t.reply_to, m.content, m.images
    )
    SELECT EXISTS (SELECT 1 FROM done) AS stored, following.*
    FROM (SELECT 1) AS one LEFT JOIN following ON true
    """
).bindparams(bindparam("messages", type_=JSONB))


def complete_turn(claim: Claim, messages: Sequence[AgentMessage], usage: Usage) -> Finished:
    """Store the reply and usage, once; nothing is stored if the lease was lost.

    One statement (ending the turn, inserting its messages, finding the session's next turn), so
    it is atomic without a transaction around it.
    """
    if len(messages) >= MESSAGE_POSITION_STRIDE:
        raise InvalidTurn(f"the agent produced {len(messages)} messages, more than one turn can hold")
    rows = [
        {
            "offset": offset,
            "role": message.role,
            "content": message.content,
            "tool_calls": message.tool_calls,
            "tool_call_id": message.tool_call_id,
            "citations": message.citations,
        }
        for offset, message in enumerate(messages, start=1)
    ]
    with autocommit_scope() as db:
        row = (
            db.execute(
                _COMPLETE,
                {
                    "turn_id": claim.turn_id,
                    "token": claim.lease_token,
                    "session_id": claim.session.id,
                    "position": claim.position,
                    "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                    "completion_tokens": int(usage.get("completion_tokens", 0)),
                    "total_tokens": int(usage.get("total_tokens", 0)),
                    "stride": MESSAGE_POSITION_STRIDE,
                    "messages": rows,
                },
            )
            .mappings()
            .one()
        )
    if not row["stored"]:
        return Finished(stored=False)
    return Finished(stored=True, next_turn=None if row["id"] is None else NextTurn.from_row(row))


def finish_turn(claim: Claim, status: TurnStatus, error: str | None = None) -> Finished:
    """End an owned turn as failed or cancelled; not stored if the lease was lost."""
    with connection_scope() as db:
        done = db.execute(
            update(Turn)
            .where(_owned(claim))
            .values(
                status=status, error=error, lease_token=None, lease_expires_at=None, finished_at=func.clock_timestamp()
            )
            .returning(Turn.id)
        ).scalar_one_or_none()
        if done is None:
            return Finished(stored=False)
        return Finished(stored=True, next_turn=next_in(db, claim.session.id))


def requeue_turn(claim: Claim, *, error: str | None = None, hand_back: bool = False) -> bool:
    """Put an owned turn back in the queue; False if not owned.

    For a retry the failed invocation counts as an attempt. A hand-back (the worker is shutting
    down) does not: the invocation neither failed nor finished, so its attempt is given back.
    """
    with connection_scope() as db:
        done = db.execute(
            update(Turn)
            .where(_owned(claim))
            .values(
                status=TurnStatus.QUEUED,
                error=error,
                lease_token=None,
                lease_expires_at=None,
                enqueued_at=func.now(),
                # A clean hand-back is not a crash: only consecutive crashed deliveries count as poison.
                deliveries=0,
                lone_crashes=0,
                crash_hosts=[],
                attempts=Turn.attempts - 1 if hand_back else Turn.attempts,
            )
            .returning(Turn.id)
        ).scalar_one_or_none()
        return done is not None

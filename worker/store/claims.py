"""Every transition of a turn's status, and nothing else writes `turns.status`.

insert (`insert_queued_turns`; `insert_turn`, and `store_turn` for a turn that arrived only as a task
message, in `worker.store.inserts`, re-exported here) -> queued; claim (`claim_turn`, `claim_message`) ->
running; retry and hand back (`requeue_turn`) and waiting for the model service or a slot of its
limits (`hold_turn`) -> queued; waiting for a person's decision on its tool calls
(`worker.store.approvals.pause_turn`) -> awaiting_approval, and back to queued after the decisions
(`worker.store.approvals.decide_calls`); complete (`complete_turn`) -> succeeded;
fail or cancel (`finish_turn`, `request_cancel`) -> failed / cancelled; take over (a lease ran out:
`take_over`, by the sweeper or a claim) -> queued; at a claim, a pending cancel -> cancelled and a
poison turn -> failed. A finished turn never changes again: every statement here matches only
unfinished turns. Each transition that ends a turn records its webhook's `ended` delivery in the
same statement or transaction (`transition_sql.end_delivery_sql`).

A claim takes a `queued` turn only when it is the turn its session runs next
(`worker.store.turns.runs_next_sql`), under the session row lock, in one statement that decides;
when it takes nothing, one read-only query says why. Ending a turn requires the claim's
`lease_token`, so a worker that lost its lease (a zombie) cannot write a second reply. The
statements themselves are in `worker.store.transition_sql`, the values the transitions return
(the store's own types) in `worker.store.claim_values`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, and_, func, insert, update
from sqlalchemy.orm import Session

from chatq.settings import Settings
from handlers.base import AgentMessage, Usage
from models.db import autocommit_scope, connection_scope, session_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, Turn, TurnStatus
from worker.errors import InvalidTurn
from worker.payload import TurnRequest, session_conflict
from worker.store import inserts
from worker.store import transition_sql as sql
from worker.store.claim_values import (
    Claim,
    ClaimedSession,
    ClaimResult,
    ClaimStatus,
    Finished,
    WhyNotClaimed,
    history_head_of,
)
from worker.store.inserts import InsertedTurn, ensure_turn, insert_queued_turn, insert_turn
from worker.store.turns import NextTurn, next_in, poison_reason

__all__ = [
    "Claim",
    "ClaimResult",
    "ClaimStatus",
    "ClaimedSession",
    "Finished",
    "InsertedTurn",
    "claim_message",
    "claim_turn",
    "complete_turn",
    "ensure_turn",
    "finish_turn",
    "insert_queued_turn",
    "insert_queued_turns",
    "insert_turn",
    "record_stops",
    "request_cancel",
    "requeue_turn",
    "take_over",
]
"""The transitions, and the values they return (`worker.store.claim_values`)."""

log = logging.getLogger(__name__)

USAGE_COLUMNS = ("prompt_tokens", "completion_tokens", "total_tokens")
"""The turn's token columns, named as a usage mapping names them."""


def claim_turn(
    turn_id: uuid.UUID, *, worker: str, engine: Engine, settings: Settings, session_id: uuid.UUID | None = None
) -> ClaimResult:
    """Take a turn for running, if it is this turn's go. See the module docstring.

    With `session_id` (the session a message names), a turn stored in another session is not
    claimed: the result is CONFLICT and the turn is left as it is. `engine` and `settings` are the
    runtime's; the settings give the lease length and the poison limit.
    """
    return _claim(turn_id, worker=worker, session_id=session_id, engine=engine, settings=settings) or _claim_slow(
        turn_id, worker=worker, expected_session=session_id, engine=engine, settings=settings
    )


def _claim(
    turn_id: uuid.UUID, *, worker: str, session_id: uuid.UUID | None, engine: Engine, settings: Settings
) -> ClaimResult | None:
    """The claim statement, which decides: the claimed turn, or None when it took nothing."""
    token = uuid.uuid4()
    # One statement: atomic on its own, so no transaction around it. Its commit is asynchronous
    # (`synchronous_commit = off` for this statement only): a claim lost to a Postgres crash only
    # runs the turn again, since ending it needs the lost lease token, and the durable commit of
    # the reply flushes the claim with it. That is 0.3 ms off every turn's start here.
    with autocommit_scope(engine) as db:
        row = (
            db.execute(
                sql.FAST_CLAIM,
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
    if row is None:
        return None
    session = ClaimedSession(
        id=row["session_id"],
        agent_framework=row["agent_framework"],
        model=row["model"],
        system_prompt=row["system_prompt"],
        metadata=dict(row["metadata"] or {}),
        knowledge_bases=tuple(row["knowledge_bases"]),
        tenant=row["tenant"],
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
        has_webhook=bool(row["has_webhook"]),
        has_steps=bool(row["has_steps"]),
        history_head=history_head_of(row["history_head"]),
    )
    return ClaimResult(status=ClaimStatus.CLAIMED, claim=claim)


_ROUNDS = 4
"""Rounds of `_claim_slow`: the longest way (a stopped worker's turn taken over, then ended as
poison or cancelled) takes two; the rest is for a race lost on the way."""


def _claim_slow(
    turn_id: uuid.UUID,
    *,
    worker: str,
    engine: Engine,
    settings: Settings,
    expected_session: uuid.UUID | None = None,
    found: Any = None,
) -> ClaimResult:
    """After the claim statement took nothing: one read-only query says why (`WHY_NOT_CLAIMED`).

    Nothing is written here but through the named transitions, each re-checking its own case: a
    turn whose worker stopped is taken over (`take_over`, as the sweeper does) and claimed by the
    claim statement; a pending cancel or a poison turn ends it (`CANCEL_AT_CLAIM`, `POISON_AT_CLAIM`).
    A transition that finds the turn changed since the query is decided again; a turn still changing
    after `_ROUNDS` rounds is answered BUSY (its message comes back shortly). `found` is the query's
    row when the caller has it already (`ENSURE_TURN` gives it for a turn that exists).
    """
    params = {"turn_id": turn_id, "session_id": expected_session, "max_deliveries": settings.max_deliveries}
    for _ in range(_ROUNDS):
        if found is None:
            with autocommit_scope(engine) as db:
                found = db.execute(sql.WHY_NOT_CLAIMED, params).one_or_none()
        if found is None:
            return ClaimResult(status=ClaimStatus.NOT_FOUND)
        why = WhyNotClaimed(found.why)
        if why is WhyNotClaimed.CONFLICT:
            assert expected_session is not None
            conflict = session_conflict(turn_id, stored_session=found.session_id, given_session=expected_session)
            return ClaimResult(status=ClaimStatus.CONFLICT, error=conflict)
        if why is WhyNotClaimed.BUSY:
            left = None if found.lease_left is None else max(float(found.lease_left), 0.0)
            return ClaimResult(status=ClaimStatus.BUSY, retry_after=left)
        if why in _ANSWERS:
            return ClaimResult(status=_ANSWERS[why])
        if why is WhyNotClaimed.STOPPED:
            with session_scope(engine) as db:
                take_over(db, [turn_id], renewal_interval=settings.renewal_interval)
        elif why is WhyNotClaimed.CANCEL_PENDING:
            with autocommit_scope(engine) as db:
                attempts = db.execute(sql.CANCEL_AT_CLAIM, {"turn_id": turn_id}).scalar_one_or_none()
            if attempts is not None:
                return ClaimResult(status=ClaimStatus.CANCELLED, attempt=attempts)
        elif why is WhyNotClaimed.POISON:
            poisoned = _poison(turn_id, found, engine, settings)
            if poisoned is not None:
                return poisoned
        claimed = _claim(turn_id, worker=worker, session_id=expected_session, engine=engine, settings=settings)
        if claimed is not None:
            return claimed
        found = None
    return ClaimResult(status=ClaimStatus.BUSY)


_ANSWERS = {
    WhyNotClaimed.FINISHED: ClaimStatus.FINISHED,
    WhyNotClaimed.BLOCKED: ClaimStatus.BLOCKED,
    WhyNotClaimed.PAUSED: ClaimStatus.PAUSED,
}
"""The reasons that are the claim's answer as they are."""


def _poison(turn_id: uuid.UUID, found: Any, engine: Engine, settings: Settings) -> ClaimResult | None:
    """Fail a poison turn for the crash counts `found` (a `WHY_NOT_CLAIMED` row); None if it changed."""
    reason = poison_reason(found, max_deliveries=settings.max_deliveries)
    assert reason is not None, "WHY_NOT_CLAIMED and poison_reason disagree"
    with autocommit_scope(engine) as db:
        attempts = db.execute(
            sql.POISON_AT_CLAIM,
            {
                "turn_id": turn_id,
                "error": reason,
                "max_deliveries": settings.max_deliveries,
                "deliveries": found.deliveries,
                "lone_crashes": found.lone_crashes,
                "hosts": len(found.crash_hosts),
            },
        ).scalar_one_or_none()
    return None if attempts is None else ClaimResult(status=ClaimStatus.POISONED, error=reason, attempt=attempts)


def _owned(claim: Claim) -> Any:
    return and_(Turn.id == claim.turn_id, Turn.status == TurnStatus.RUNNING, Turn.lease_token == claim.lease_token)


def complete_turn(claim: Claim, messages: Sequence[AgentMessage], usage: Usage, *, engine: Engine) -> Finished:
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
    with autocommit_scope(engine) as db:
        row = (
            db.execute(
                sql.COMPLETE,
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


def finish_turn(
    claim: Claim, status: TurnStatus, error: str | None = None, *, engine: Engine, usage: Usage | None = None
) -> Finished:
    """End an owned turn as failed or cancelled (with its webhook's delivery); not stored if the lease was lost.

    `usage`: the tokens its finished steps used, stored on the turn (a turn its tenant's budget
    stopped: `worker.budgets` counts them); None leaves the turn's tokens as they are."""
    tokens = {} if usage is None else {name: int(usage.get(name, 0)) for name in USAGE_COLUMNS}
    with connection_scope(engine) as db:
        done = db.execute(
            update(Turn)
            .where(_owned(claim))
            .values(
                status=status,
                error=error,
                lease_token=None,
                lease_expires_at=None,
                finished_at=func.clock_timestamp(),
                **tokens,
            )
            .returning(Turn.id)
        ).scalar_one_or_none()
        if done is None:
            return Finished(stored=False)
        db.execute(sql.FINISH_DELIVERY, {"turn_id": claim.turn_id})  # its webhook's, with the end
        return Finished(stored=True, next_turn=next_in(db, claim.session.id))


def requeue_turn(claim: Claim, *, engine: Engine, error: str | None = None, hand_back: bool = False) -> bool:
    """Put an owned turn back in the queue; False if not owned.

    For a retry the failed invocation counts as an attempt. A hand-back (the worker is shutting
    down) does not: the invocation neither failed nor finished, so its attempt is given back.
    """
    return _back_in_queue(claim, engine, due=func.now(), give_back_attempt=hand_back, error=error)


def hold_turn(claim: Claim, *, engine: Engine, seconds: float) -> bool:
    """Put an owned turn back to wait `seconds` for the model service or a slot of its limits; False if not owned.

    As for a hand-back, the attempt is given back: the invocation neither failed nor finished.
    `enqueued_at` is set to when its delayed message is due, so the sweeper does not take a turn
    sitting out a long Retry-After for one whose message was lost.
    """
    due = func.now() + timedelta(seconds=max(seconds, 0.0))
    return _back_in_queue(claim, engine, due=due, give_back_attempt=True)


def _back_in_queue(claim: Claim, engine: Engine, *, due: Any, give_back_attempt: bool, **values: Any) -> bool:
    """The one statement of requeue and hold: the owned turn queued again, due at `due`."""
    with connection_scope(engine) as db:
        done = db.execute(
            update(Turn)
            .where(_owned(claim))
            .values(
                status=TurnStatus.QUEUED,
                lease_token=None,
                lease_expires_at=None,
                enqueued_at=due,
                # Going back to the queue on purpose is not a crash: only consecutive crashed
                # deliveries count as poison.
                deliveries=0,
                lone_crashes=0,
                crash_hosts=[],
                attempts=Turn.attempts - 1 if give_back_attempt else Turn.attempts,
                **values,
            )
            .returning(Turn.id)
        ).scalar_one_or_none()
        return done is not None


def request_cancel(db: Session | Connection, turn_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, TurnStatus]:
    """Cancel unfinished turns in the caller's transaction: queued ones end `cancelled` now, running
    ones are asked to stop (their worker ends them). Returns each changed turn's status now."""
    if not turn_ids:
        return {}
    rows = db.execute(sql.CANCEL, {"turn_ids": list(turn_ids)}).all()
    return {row.id: TurnStatus(row.status) for row in rows}


def record_stops(db: Session, turn_ids: Sequence[uuid.UUID], *, renewal_interval: float) -> None:
    """Record that the workers running these turns stopped: their leases ran out unrenewed.

    The caller holds the turns' row locks, has seen them `running` with an expired lease and is
    about to move them on. One statement for all of them, so turns of one worker handled together
    see each other as they were; each turn keeps its stop (`stopped_worker`, `stopped_at`), so a
    turn handled later still finds those moved before it. The window is a renewal interval either
    side, and as much again for a slow renewal query: a live worker's leases sit about a lease
    length ahead, well outside it.
    """
    window = 1.5 * renewal_interval
    db.execute(sql.RECORD_STOPS, {"turn_ids": list(turn_ids), "window": window})


def take_over(db: Session, turn_ids: Sequence[uuid.UUID], *, renewal_interval: float) -> list[uuid.UUID]:
    """Release turns whose lease ran out back to `queued` (the sweeper), their stops recorded first.

    The caller holds their row locks; `renewal_interval` is the settings' (`record_stops`). Returns
    those released (still running with an expired lease).
    """
    if not turn_ids:
        return []
    # All in one statement, before any lease is cleared: turns that stopped together see each other.
    record_stops(db, turn_ids, renewal_interval=renewal_interval)
    return list(db.execute(sql.RELEASE, {"turn_ids": list(turn_ids)}).scalars())


def claim_message(
    request: TurnRequest, *, queue: str, worker: str, engine: Engine, settings: Settings, stored: bool = True
) -> ClaimResult:
    """Claim a delivered message's turn (as `claim_turn`), storing it first when it arrived only
    through Redis (a raw producer's message: its session too, when nobody created it).

    A message whose turn is stored costs the claim statement alone; one the claim statement did not
    take costs one more statement (`ENSURE_TURN`), which either stores the turn (then the claim
    statement runs again) or says why the claim took nothing (then as `claim_turn`). Raises
    SessionDeleted for a message of a session deleted since it was sent and InvalidTurn for a
    reply_to that is not a user message of the session; nothing is stored then. `stored=False` (a
    message that did not come from chatq's producer, `worker.dispatch.STORED_HEADER`) runs
    `ENSURE_TURN` first: its turn is most likely not stored, and the claim statement would miss.
    """
    turn_id, session_id = request.turn_id, request.session_id
    if stored:
        claimed = _claim(turn_id, worker=worker, session_id=session_id, engine=engine, settings=settings)
        if claimed is not None:
            return claimed
    found = inserts.store_turn(request, queue=queue, engine=engine, max_deliveries=settings.max_deliveries)
    if found is inserts.STORED:
        claimed = _claim(turn_id, worker=worker, session_id=session_id, engine=engine, settings=settings)
        if claimed is not None:
            return claimed
        found = None
    elif found is None:
        return ClaimResult(status=ClaimStatus.BUSY)  # the session kept changing: the message comes back
    return _claim_slow(
        turn_id, worker=worker, engine=engine, settings=settings, expected_session=session_id, found=found
    )


def insert_queued_turns(
    db: Connection, turns: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> None:
    """Store many new turns as `queued` with their user messages (a batch's fresh sessions).

    `turns` are rows of `turns` without a status (their sessions' positions already taken);
    `messages` rows of `chat_messages`. Core executemany: one cached statement sent in pages.
    """
    if turns:
        db.execute(insert(cast(Table, Turn.__table__)), [{**row, "status": TurnStatus.QUEUED} for row in turns])
    if messages:
        db.execute(insert(cast(Table, ChatMessage.__table__)), list(messages))

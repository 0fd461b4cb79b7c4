"""The approval transitions of a turn: running -> awaiting_approval (`pause_turn`), and back to
queued once its round's calls are all decided (`decide_calls`, by a person or, past the deadline,
by the sweep); and the reads of what waits (`pending_calls`, `expired_approvals`).

A pause of a turn with a webhook records its webhook delivery (`webhook_deliveries`, event
`awaiting_approval`) in the transaction that pauses it: a paused turn always has it, and the
caller sends its task message once that transaction is committed (the sweep does if it never is).
A cancel asked while it ran ends it instead, recording its `ended` delivery the same way.

A paused turn holds its session's place (it is unfinished: `worker.store.turns.runs_next_sql`)
without a lease, a worker or a message in Redis: Postgres holds it, and the decision that makes it
runnable again finds it as the session's next turn and hands it back to be sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from handlers.approvals import Decision, PendingCall
from handlers.journal import StepKind
from models.db import autocommit_scope, connection_scope
from models.tables import TurnStatus
from worker.errors import ApprovalConflict, ApprovalExpired, InvalidTurn, TurnNotFound
from worker.store import transition_sql as sql
from worker.store.claim_values import Claim
from worker.store.journal import read_steps
from worker.store.turns import NextTurn, next_in

__all__ = [
    "Decided",
    "Paused",
    "decide_calls",
    "expired_approvals",
    "list_pending",
    "pause_body",
    "pause_turn",
    "pending_calls",
]

TIMED_OUT = "timed out"
"""The reason of the sweep's denial of calls whose deadline passed."""


@dataclass(frozen=True, kw_only=True)
class Paused:
    """The outcome of `pause_turn`."""

    stored: bool
    """False when the lease was lost: nothing was written."""
    cancelled: bool = False
    """True: a cancel was asked while it ran, so it ended `cancelled` instead of pausing."""
    until: float | None = None
    """Unix time of its deadline (paused)."""
    next_turn: NextTurn | None = None
    """Cancelled: the session's next queued turn, to send now."""
    delivery_id: uuid.UUID | None = None
    """Paused with a webhook: the delivery recorded with the pause, whose task message is to be sent."""


@dataclass(frozen=True, kw_only=True)
class Decided:
    """The outcome of `decide_calls`."""

    session_id: uuid.UUID
    """The turn's session."""
    resumed: bool
    """True: that was the round's last decision; the turn is queued again."""
    next_turn: NextTurn | None = None
    """The turn itself when it is its session's next (it is, having held its place): send it now."""
    calls: tuple[str, ...] = ()
    """The calls this decision recorded (call ids, in the order they were made)."""


def pause_turn(claim: Claim, *, seconds: float, engine: Engine, calls: Sequence[Mapping[str, Any]] = ()) -> Paused:
    """Move an owned running turn to `awaiting_approval` for at most `seconds`; not stored if the lease was lost.

    With a webhook (the turn's, else its session's) the same transaction records the pause's
    delivery, whose body names the waiting `calls` (`{"id", "name", "args"}`) and the deadline."""
    with connection_scope(engine) as db:
        row = db.execute(
            sql.PAUSE, {"turn_id": claim.turn_id, "token": claim.lease_token, "seconds": max(seconds, 0.0)}
        ).one_or_none()
        if row is None:
            return Paused(stored=False)
        if row.status == TurnStatus.CANCELLED.value:
            return Paused(stored=True, cancelled=True, next_turn=next_in(db, claim.session.id))
        until = float(row.until)
        # Not from the claim's `has_webhook`: the session's webhook may have been set since the claim.
        body = pause_body(claim.turn_id, claim.session.id, calls, until)
        delivery_id = db.execute(
            _RECORD_PAUSE_DELIVERY, {"id": uuid.uuid4(), "turn_id": claim.turn_id, "body": body}
        ).scalar_one_or_none()
        return Paused(stored=True, until=until, delivery_id=delivery_id)


def pause_body(turn_id: uuid.UUID, session_id: uuid.UUID, calls: Sequence[Mapping[str, Any]], until: float) -> str:
    """The JSON a pause's webhook delivery POSTs (docs/contract.md, "Webhooks"), the same bytes on every attempt."""
    body = {
        "id": str(turn_id),
        "session_id": str(session_id),
        "status": TurnStatus.AWAITING_APPROVAL.value,
        "calls": [{"id": call["id"], "name": call["name"], "args": call.get("args")} for call in calls],
        "until": until,
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def pending_calls(db: Connection, turn_id: uuid.UUID) -> tuple[dict[str, PendingCall], dict[str, dict[str, Any]]]:
    """The open round's calls recorded as waiting (call id -> call), and its decisions as stored (call id -> dict)."""
    pending: dict[str, PendingCall] = {}
    decided: dict[str, dict[str, Any]] = {}
    for step in read_steps(db, turn_id):
        if step.kind is StepKind.MODEL:
            pending, decided = {}, {}
        elif step.kind is StepKind.APPROVAL_PENDING and step.call_id is not None:
            pending[step.call_id] = PendingCall(id=step.call_id, name=step.tool_name or "", args=step.args or {})
        elif step.kind is StepKind.APPROVAL_DECIDED and step.call_id is not None and step.decision is not None:
            decided[step.call_id] = step.decision.to_dict()
    return pending, decided


def decide_calls(
    turn_id: uuid.UUID,
    decisions: Mapping[str, Decision] | None,
    *,
    engine: Engine,
    tenant: str | None = None,
    check: Callable[[PendingCall, Decision], Decision] | None = None,
    every: Decision | None = None,
) -> Decided:
    """Record decisions on a paused turn's waiting calls, in one transaction under the turn's row lock.

    `decisions` (call id -> decision): each call must wait and be undecided (else ApprovalConflict),
    the deadline must not have passed (else ApprovalExpired); `check` may refuse or adjust each
    decision (the arguments against the tool's schema) before anything is written. None: the sweep,
    which denies every undecided call "timed out", and only once the deadline has passed. After the
    round's last decision the turn is queued again and returned to be sent (`Decided.next_turn`).
    TurnNotFound for a turn that does not exist (or is another tenant's). With `every` (and
    `decisions` empty) that decision goes to every call of the round still waiting, read under the
    lock; edited `args` then need exactly one waiting call (else InvalidTurn).
    """
    with connection_scope(engine) as db:
        turn = db.execute(sql.LOCK_PAUSED, {"turn_id": turn_id, "tenant": tenant}).one_or_none()
        if turn is None:
            raise TurnNotFound(f"turn {turn_id} does not exist")
        pending, decided = pending_calls(db, turn_id)
        if every is not None:
            decisions = _every_waiting(turn_id, turn, pending, decided, every)
        if decisions is None:
            if turn.status != TurnStatus.AWAITING_APPROVAL.value or not turn.expired:
                return Decided(session_id=turn.session_id, resumed=False)
            decisions = {
                call_id: Decision(approve=False, reason=TIMED_OUT, timed_out=True)
                for call_id in pending
                if call_id not in decided
            }
        else:
            for call_id in decisions:
                earlier = decided.get(call_id)
                if earlier is not None and earlier.get("timed_out"):
                    raise ApprovalExpired(f"the deadline of call {call_id} of turn {turn_id} passed; it was denied")
            if turn.status != TurnStatus.AWAITING_APPROVAL.value:
                raise ApprovalConflict(f"turn {turn_id} is not awaiting approval (it is {turn.status})")
            for call_id in decisions:
                if call_id not in pending:
                    raise ApprovalConflict(f"no call {call_id[:80]!r} of turn {turn_id} awaits a decision")
                if call_id in decided:
                    raise ApprovalConflict(f"call {call_id} of turn {turn_id} was decided already")
            if turn.expired:
                raise ApprovalExpired(f"the approval deadline of turn {turn_id} passed")
            if check is not None:
                decisions = {call_id: check(pending[call_id], d) for call_id, d in decisions.items()}
        for call_id, decision in decisions.items():
            db.execute(
                sql.RECORD_DECISION,
                {
                    "turn_id": turn_id,
                    "attempt": turn.attempts,
                    "call_id": call_id,
                    "tool_name": pending[call_id].name,
                    "message": decision.to_dict(),
                },
            )
        calls = tuple(decisions)
        if set(pending) - set(decided) - set(decisions):
            return Decided(session_id=turn.session_id, resumed=False, calls=calls)
        resumed = db.execute(sql.RESUME_DECIDED, {"turn_id": turn_id}).one_or_none() is not None
        return Decided(
            session_id=turn.session_id,
            resumed=resumed,
            next_turn=next_in(db, turn.session_id) if resumed else None,
            calls=calls,
        )


def _every_waiting(
    turn_id: uuid.UUID,
    turn: Any,
    pending: Mapping[str, PendingCall],
    decided: Mapping[str, Mapping[str, Any]],
    every: Decision,
) -> dict[str, Decision]:
    """`every` for each call of the open round still waiting: the same answers as naming each call would give."""
    waiting = [call_id for call_id in pending if call_id not in decided]
    if not waiting:
        if pending and all(decided[call_id].get("timed_out") for call_id in pending):
            raise ApprovalExpired(f"the approval deadline of turn {turn_id} passed; its calls were denied")
        if turn.status != TurnStatus.AWAITING_APPROVAL.value:
            raise ApprovalConflict(f"turn {turn_id} is not awaiting approval (it is {turn.status})")
        raise ApprovalConflict(f"no call of turn {turn_id} awaits a decision")
    if every.args is not None and len(waiting) > 1:
        raise InvalidTurn(f"turn {turn_id} has {len(waiting)} waiting calls: name the call_id that args are for")
    return dict.fromkeys(waiting, every)


def expired_approvals(*, engine: Engine, limit: int = 100) -> list[uuid.UUID]:
    """Paused turns whose deadline passed, oldest deadline first (the sweep decides them)."""
    with autocommit_scope(engine) as db:
        return list(db.execute(sql.EXPIRED_APPROVALS, {"limit": limit}).scalars())


def list_pending(*, engine: Engine, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Paused turns and their undecided calls, oldest first: `{"turn_id", "session_id", "until", "calls"}`."""
    with connection_scope(engine) as db:
        rows = db.execute(_PAUSED, {"tenant": tenant, "limit": limit}).all()
        found = []
        for row in rows:
            pending, decided = pending_calls(db, row.id)
            calls = [call.to_dict() for call_id, call in pending.items() if call_id not in decided]
            found.append(
                {"turn_id": str(row.id), "session_id": str(row.session_id), "until": float(row.until), "calls": calls}
            )
        return found


_RECORD_PAUSE_DELIVERY = text(
    """
    -- Under the row lock the pause took: the turn's next delivery, to its webhook, its body fixed now.
    INSERT INTO webhook_deliveries (id, turn_id, event, ordinal, url, status, attempts, body)
    SELECT :id, t.id, 'awaiting_approval',
           1 + coalesce((SELECT max(d.ordinal) FROM webhook_deliveries d WHERE d.turn_id = t.id), 0),
           coalesce(t.webhook_url, s.webhook_url), 'pending', 0, :body
    FROM turns t JOIN chat_sessions s ON s.id = t.session_id
    WHERE t.id = :turn_id AND coalesce(t.webhook_url, s.webhook_url) IS NOT NULL
    RETURNING id
    """
)


_PAUSED = text(
    """
    SELECT t.id, t.session_id, CAST(extract(epoch FROM t.approval_until) AS float8) AS until
    FROM turns t JOIN chat_sessions s ON s.id = t.session_id
    WHERE t.status = 'awaiting_approval' AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
    ORDER BY t.approval_until LIMIT :limit
    """
)

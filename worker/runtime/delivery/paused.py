"""A turn whose tool calls wait for a person (`handlers.approvals`): paused without holding anything.

The runner calls `pause` when the handler raised `AwaitingApproval` (its round's waiting calls
already recorded in the journal): the turn moves to `awaiting_approval` in Postgres, giving up its
lease (the caller then releases its thread and its model slot, and the Celery task ends), and one
`approval_required` event tells consumers what waits and until when. A turn with a webhook has
its pause's delivery recorded by the transaction that pauses it; its task message is sent here.
A cancel asked while it ran ends it instead. The decision (`worker.approvals`) or the sweep's
deadline sends it again, and the attempt that resumes it reports how long each call waited
(`report_waits`).
"""

from __future__ import annotations

import logging
import math
import uuid

from chatq.masking import mask_secrets
from chatq.settings import Settings
from handlers.errors import AwaitingApproval
from handlers.journal import StepKind
from worker.dispatch import send_delivery, send_next
from worker.events import EventType, TurnEvents
from worker.runtime.delivery.process import Runtime
from worker.runtime.observers import hooks
from worker.runtime.observers.hooks import Facts
from worker.store import claims
from worker.store.approvals import Paused, pause_turn
from worker.store.journal import TurnJournal

__all__ = ["approval_seconds", "pause", "report_waits"]

log = logging.getLogger(__name__)


def approval_seconds(metadata: object, settings: Settings) -> float:
    """How long a session's turn waits for decisions: its `approval_timeout` metadata (seconds), else
    `CHATQ_APPROVAL_TIMEOUT`."""
    own = metadata.get("approval_timeout") if isinstance(metadata, dict) else None
    if isinstance(own, int | float) and not isinstance(own, bool) and math.isfinite(own) and own > 0:
        return float(own)
    return settings.approval_timeout


def pause(claim: claims.Claim, events: TurnEvents, exc: AwaitingApproval, *, runtime: Runtime) -> Paused:
    """Pause the claimed turn, announce it, call the `paused` hook (or, cancelled meanwhile, end it)."""
    seconds = approval_seconds(dict(claim.session.metadata), runtime.settings)
    calls = [call.to_dict() for call in exc.calls]
    paused = pause_turn(claim, seconds=seconds, engine=runtime.engine, calls=calls)
    if not paused.stored:
        return paused
    facts = Facts.of_claim(claim, runtime.settings)
    if paused.cancelled:
        events.publish(EventType.CANCELLED, claim.attempt)
        runtime.hooks.cancelled(hooks.Cancelled(turn=facts))
        send_next(paused.next_turn, client=runtime.redis)
        return paused
    if paused.delivery_id is not None:
        _send_pause_delivery(claim, paused.delivery_id)
    events.publish(EventType.APPROVAL_REQUIRED, claim.attempt, calls=calls, until=paused.until)
    log.info(
        "turn %s session %s: awaiting approval of %d call(s) (%s)",
        claim.turn_id,
        claim.session.id,
        len(calls),
        ", ".join(call["name"] for call in calls),
    )
    runtime.hooks.paused(hooks.Paused(turn=facts, calls=tuple(call["name"] for call in calls), seconds=seconds))
    return paused


def _send_pause_delivery(claim: claims.Claim, delivery_id: uuid.UUID) -> None:
    """Send the task message of the webhook delivery the pause recorded; the pause stands if that fails."""
    try:
        send_delivery(delivery_id)
    except Exception as exc:  # the row is pending in Postgres: the sweep sends it (`worker.runtime.webhooks.recovery`)
        log.warning("turn %s: could not queue its pause's webhook delivery: %s", claim.turn_id, mask_secrets(str(exc)))
        return
    log.info("turn %s: webhook delivery %s (awaiting approval) queued", claim.turn_id, delivery_id)


def report_waits(claim: claims.Claim, journal: TurnJournal, *, runtime: Runtime) -> None:
    """Call the `approval_waited` hook for each call of the open round decided since the pause, when
    this attempt is the one that resumes the turn: its first delivery after the pause (the pause
    reset the count) and the attempt right after the decisions' (the pause gave its attempt back).
    A retry or takeover of the resumed attempt reads the same decisions and reports nothing."""
    if claim.deliveries != 1:
        return
    paused_at: dict[str, float] = {}
    decided: list[tuple[str, float, str]] = []
    for step in journal.done:
        if step.kind is StepKind.MODEL:
            paused_at, decided = {}, []
        elif step.kind is StepKind.APPROVAL_PENDING and step.call_id is not None and step.at is not None:
            paused_at[step.call_id] = step.at
        elif (
            step.kind is StepKind.APPROVAL_DECIDED
            and step.decision is not None
            and step.call_id is not None
            and step.at is not None
            and step.attempt == claim.attempt - 1  # decided since the pause, which gave its attempt back
        ):
            decision = step.decision
            outcome = "timed_out" if decision.timed_out else "approved" if decision.approve else "denied"
            decided.append((step.call_id, step.at, outcome))
    facts = Facts.of_claim(claim, runtime.settings) if decided else None
    for call_id, at, outcome in decided:
        if call_id in paused_at and facts is not None:
            seconds = max(at - paused_at[call_id], 0.0)
            runtime.hooks.approval_waited(hooks.ApprovalWaited(turn=facts, outcome=outcome, seconds=seconds))

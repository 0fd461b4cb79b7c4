"""Webhooks: when a turn with a webhook pauses for approval or ends, chatq POSTs it there, at least once, signed.

Every delivery is a `webhook_deliveries` row recorded in the transaction that pauses or ends the
turn (event `awaiting_approval`: `worker.store.approvals.pause_turn`; event `ended`:
`worker.store.transition_sql.end_delivery_sql`, in every transition that ends one, a queued turn
cancelled included). Its id is the delivery id (`X-Chatq-Delivery`) and the Celery task id of its
`chatq.deliver_webhook` messages on the `chatq.webhooks` queue; `ordinal` numbers a turn's rows in
order. After the commit the message is sent: by the lifecycle hook `WebhookHooks`
(`worker.runtime.observers.observers.default_hooks`) for an end a worker saw, by the producer for a
turn cancelled while queued, by `worker.runtime.delivery.paused` for a pause. A message that was
never sent or was lost is sent again by the sweep (`worker.runtime.webhooks.recovery`).

`deliver` is one attempt, called by the task. It first takes the row for the attempt, in one
conditional statement: still `pending` and due (`next_attempt_at`), which it moves ahead by the
attempt's time limit, so a copy of the message (the sweep's, a late one) finds it not due and does
nothing: one attempt at a time, one chain of retries. Then an `ended` body is fixed at the first
attempt (the turn as `GET /turns/{id}` returns it, without its own `webhook` entry), the host
resolved and checked (`worker.webhook_urls`), the request signed and sent
(`worker.runtime.webhooks.webhook_http`), and the answer recorded on the row (attempts, last status
code, last error, when the next attempt is due) if the row is still this attempt's. Anything but a
2xx is retried on the policy's back-off (`RetryPolicy.after_webhook_attempt`, about an hour); a
refused address fails at once. A worker process sends at most `CHATQ_WEBHOOK_CONCURRENCY`
deliveries at a time (a full process answers "busy" and the task comes back a second later), so
slow receivers never occupy more than that many of the threads that run turns.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sqlalchemy import Engine, text

from chatq.masking import mask_secrets
from models.db import session_scope
from models.tables import DeliveryEvent, DeliveryStatus
from worker.dispatch import WEBHOOK_TASK_NAME as TASK_NAME
from worker.dispatch import send_end_delivery
from worker.errors import TurnNotFound, WebhookRefused
from worker.payload import WEBHOOK_QUEUE
from worker.runtime.observers import hooks
from worker.runtime.observers.hook_points import WebhookAttempt
from worker.runtime.webhooks.webhook_http import Answer, post, signed_headers
from worker.webhook_urls import resolve_target

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

__all__ = [
    "BUSY_DELAY",
    "TASK_NAME",
    "WEBHOOK_QUEUE",
    "Attempted",
    "DeliveryOutcome",
    "WebhookHooks",
    "deliver",
    "send_end_delivery",
]

log = logging.getLogger(__name__)

BUSY_DELAY = 1.0
"""Seconds before a delivery that found its process's delivery slots full comes back."""

DUE_SLACK = 1.0
"""Seconds early a message may come for its attempt (its countdown is timed by the worker's clock,
`next_attempt_at` by Postgres's); a copy sent while an attempt was under way comes later than this."""
HOLD_MARGIN = 2.0
"""Seconds an attempt holds its row beyond its time limit (`CHATQ_WEBHOOK_TIMEOUT`): its queries
around the POST. More than `DUE_SLACK`, so no copy of the message takes the row while it runs."""

_TAKE = text(
    """
    -- This attempt's, if the delivery is pending and due: held until its time is up. A message was
    -- taken, so the sweep's back-off between re-sends starts over.
    UPDATE webhook_deliveries d
    SET next_attempt_at = clock_timestamp() + make_interval(secs => :hold), resends = 0
    FROM turns t
    WHERE d.id = :id AND t.id = d.turn_id AND d.status = 'pending'
      AND d.next_attempt_at <= clock_timestamp() + make_interval(secs => :slack)
    RETURNING d.turn_id, d.event, d.url, d.body, d.attempts, t.status AS turn_status, d.next_attempt_at AS held_until,
              extract(epoch FROM clock_timestamp() - d.created_at) AS age
    """
)
_FIX_BODY = text("UPDATE webhook_deliveries SET body = coalesce(body, :body) WHERE id = :id RETURNING body")
_RECORD = text(
    """
    -- Only while the row is still this attempt's (another attempt took it once its time was up).
    UPDATE webhook_deliveries
    SET attempts = attempts + :posted, status = :status, last_status_code = :code, last_error = :error,
        last_attempt_at = now(), delivered_at = CASE WHEN CAST(:status AS varchar) = 'delivered' THEN now() END,
        next_attempt_at = CASE WHEN CAST(:status AS varchar) = 'pending'
                               THEN clock_timestamp() + make_interval(secs => :delay) ELSE next_attempt_at END
    WHERE id = :id AND status = 'pending' AND next_attempt_at = :held_until
    RETURNING id
    """
)


class DeliveryOutcome(enum.StrEnum):
    """What one run of the delivery task did."""

    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    BUSY = "busy"
    """This process already sends `CHATQ_WEBHOOK_CONCURRENCY` deliveries; try again shortly."""
    DONE = "done"
    """Nothing to do: delivered or given up already, not due (a copy of the message while another
    runs or waits), or the turn was deleted."""


@dataclass(frozen=True, kw_only=True)
class Attempted:
    """The outcome of `deliver`."""

    outcome: DeliveryOutcome
    """What happened."""
    retry_after: float | None = None
    """For RETRY and BUSY: seconds after which the task should run again."""
    status_code: int | None = None
    """The receiver's HTTP status, when it answered."""
    error: str | None = None
    """Why it was not delivered."""


def deliver(delivery_id: uuid.UUID, *, runtime: Runtime) -> Attempted:
    """One attempt of a delivery, recorded on its row; outages (Postgres down) propagate to the task."""
    with delivery_slot(runtime.settings.webhook_concurrency) as free:
        if not free:
            return Attempted(outcome=DeliveryOutcome.BUSY, retry_after=BUSY_DELAY)
        return _attempt(delivery_id, runtime)


def _attempt(delivery_id: uuid.UUID, runtime: Runtime) -> Attempted:
    settings, engine = runtime.settings, runtime.engine
    hold = settings.webhook_timeout + HOLD_MARGIN
    with session_scope(engine) as db:
        row = db.execute(_TAKE, {"id": delivery_id, "hold": hold, "slack": DUE_SLACK}).one_or_none()
    if row is None:  # delivered, failed, deleted, or not due: another copy of the message has it
        log.debug("webhook delivery %s: nothing due", delivery_id)
        return Attempted(outcome=DeliveryOutcome.DONE)
    taken = _Taken(delivery_id=delivery_id, held_until=row.held_until)
    try:
        body = (row.body or _fix_body(engine, delivery_id, row.turn_id)).encode("utf-8")
    except TurnNotFound:  # its session was deleted in between (the delivery went with it)
        return Attempted(outcome=DeliveryOutcome.DONE)
    attempt = int(row.attempts) + 1
    host = urlsplit(row.url).hostname or "?"
    started = time.monotonic()
    try:
        target = resolve_target(row.url, allow_private=settings.webhook_allow_private)
    except WebhookRefused as exc:
        answer = Answer(status_code=None, error=exc.message)
        _record(engine, taken, DeliveryStatus.FAILED, answer, posted=False)  # `attempts` counts POSTs: none made
        runtime.hooks.webhook_attempt(WebhookAttempt(outcome="refused", seconds=None))
        log.warning("turn %s: webhook delivery %s refused: %s", row.turn_id, delivery_id, exc.message)
        return Attempted(outcome=DeliveryOutcome.FAILED, error=exc.message)
    headers = signed_headers(
        delivery_id=str(delivery_id),
        # A pause's delivery tells of the pause, whatever the turn has done since.
        event=f"turn.{row.turn_status if row.event == DeliveryEvent.ENDED.value else row.event}",
        attempt=attempt,
        timestamp=int(time.time()),
        body=body,
        secret=settings.webhook_secret,
    )
    answer = post(target, body, headers, timeout=settings.webhook_timeout)
    seconds = time.monotonic() - started
    if answer.delivered:
        _record(engine, taken, DeliveryStatus.DELIVERED, answer)
        runtime.hooks.webhook_attempt(WebhookAttempt(outcome=DeliveryOutcome.DELIVERED.value, seconds=seconds))
        log.info("turn %s: webhook delivery %s to %s: HTTP %s", row.turn_id, delivery_id, host, answer.status_code)
        return Attempted(outcome=DeliveryOutcome.DELIVERED, status_code=answer.status_code)
    decision = runtime.retry.after_webhook_attempt(attempt, float(row.age) + seconds)
    status = DeliveryStatus.PENDING if decision.retry else DeliveryStatus.FAILED
    kept = _record(engine, taken, status, answer, delay=decision.delay)
    outcome = DeliveryOutcome.RETRY if decision.retry else DeliveryOutcome.FAILED
    runtime.hooks.webhook_attempt(WebhookAttempt(outcome=outcome.value, seconds=seconds))
    log.warning(
        "turn %s: webhook delivery %s to %s, attempt %d: %s (%s)",
        row.turn_id,
        delivery_id,
        host,
        attempt,
        mask_secrets(answer.error or ""),
        f"retry in {decision.delay:g} s" if decision.retry else "giving up",
    )
    if not kept:  # another attempt took the row meanwhile: its chain goes on, not this one
        return Attempted(outcome=DeliveryOutcome.DONE, status_code=answer.status_code, error=answer.error)
    return Attempted(
        outcome=outcome,
        retry_after=decision.delay if decision.retry else None,
        status_code=answer.status_code,
        error=answer.error,
    )


@dataclass(frozen=True, kw_only=True)
class _Taken:
    """A delivery row an attempt took (`_TAKE`)."""

    delivery_id: uuid.UUID
    """The delivery."""
    held_until: datetime
    """Its `next_attempt_at` as the take set it: the row is still this attempt's while it holds that."""


def _fix_body(engine: Engine, delivery_id: uuid.UUID, turn_id: uuid.UUID) -> str:
    """The turn as `GET /turns/{id}` returns it, stored once: every retry sends these same bytes."""
    from worker.queries import turn_report

    report = turn_report(turn_id)
    report.pop("webhook", None)  # the delivery's own state changes with each attempt
    body = json.dumps(report, separators=(",", ":"), ensure_ascii=False)
    with session_scope(engine) as db:
        return str(db.execute(_FIX_BODY, {"id": delivery_id, "body": body}).scalar_one())


def _record(
    engine: Engine,
    taken: _Taken,
    status: DeliveryStatus,
    answer: Answer,
    *,
    posted: bool = True,
    delay: float = 0.0,
) -> bool:
    """Record an attempt's answer on its row; False if the row is no longer this attempt's."""
    values = {
        "id": taken.delivery_id,
        "held_until": taken.held_until,
        "status": status.value,
        "code": answer.status_code,
        "error": answer.error,
        "delay": max(delay, 0.0),
    }
    with session_scope(engine) as db:
        kept = db.execute(_RECORD, {**values, "posted": int(posted)})
        return kept.first() is not None


_slots: dict[int, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


@contextlib.contextmanager
def delivery_slot(concurrency: int) -> Iterator[bool]:
    """One of this process's `concurrency` (`CHATQ_WEBHOOK_CONCURRENCY`) delivery slots, if one is free (never waits).

    The slots are sized by the first call in a process (a worker's settings never change)."""
    pid = os.getpid()
    with _slots_lock:
        slots = _slots.get(pid)
        if slots is None:
            slots = _slots[pid] = threading.BoundedSemaphore(concurrency)
    free = slots.acquire(blocking=False)
    try:
        yield free
    finally:
        if free:
            slots.release()


class WebhookHooks(hooks.TurnHooks):
    """Sends the webhook delivery of every turn that ends with one, which its end recorded (the
    claim says which have one)."""

    def __init__(self, engine: Callable[[], Engine]) -> None:
        self._engine = engine
        """The process's engine, asked for when a turn ends (the edge that wires the hooks hands it in)."""

    def succeeded(self, event: hooks.Succeeded) -> None:
        self._ended(event.turn)

    def failed(self, event: hooks.Failed) -> None:
        self._ended(event.turn)

    def cancelled(self, event: hooks.Cancelled) -> None:
        self._ended(event.turn)

    def _ended(self, turn: hooks.Facts) -> None:
        # None: the delivery ran no attempt (the turn ended at its claim), so ask Postgres.
        if turn.has_webhook is not False:
            send_end_delivery(turn.turn_id, engine=self._engine())

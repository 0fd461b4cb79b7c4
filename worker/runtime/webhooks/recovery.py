"""The sweep's part in webhooks: sending again the deliveries whose task message was lost.

A delivery row is committed with the pause or end of its turn and its message sent after the
commit, so a process killed in between (or a Redis that lost the message, or a worker killed
mid-attempt) leaves a `pending` row that no message will attempt. Such a row is due
(`next_attempt_at`) and stays so: a live chain of attempts moves it ahead at each attempt. The
sweep takes the rows due for longer than CHATQ_REQUEUE_GRACE (twice that after one re-send, four
times after two, at most twenty: the sweep cannot tell a lost message from one waiting in a queue
no worker takes from, and must not pile copies there), each in one conditional statement
that makes it due now (so another sweep, which needs it due for the grace, leaves it), and sends
their messages. A copy of a message that was only late finds the row taken by whichever attempt
came first and does nothing (`worker.runtime.webhooks.deliveries`).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import text

from chatq.masking import mask_secrets
from models.db import autocommit_scope
from worker.dispatch import send_delivery

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

__all__ = ["SWEEP_LIMIT", "resend_lost_deliveries", "take_lost_deliveries"]

log = logging.getLogger(__name__)

SWEEP_LIMIT = 200
"""Deliveries one sweep sends again at most (the oldest due first; the next sweep goes on)."""

_TAKE_LOST = text(
    """
    -- Due for longer than the grace (doubled at each re-send, at most 20 graces): no message will
    -- attempt them. Due now again, for the message sent next; rows another sweep holds are skipped,
    -- and re-checked when locked.
    UPDATE webhook_deliveries d
    SET next_attempt_at = clock_timestamp(), resends = d.resends + 1
    WHERE d.id IN (
        SELECT id FROM webhook_deliveries
        WHERE status = 'pending'
          AND next_attempt_at < clock_timestamp() - make_interval(secs => :grace * least(power(2, resends), 20))
        ORDER BY next_attempt_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
      AND d.status = 'pending'
      AND d.next_attempt_at < clock_timestamp() - make_interval(secs => :grace * least(power(2, d.resends), 20))
    RETURNING d.id, d.turn_id
    """
)


def take_lost_deliveries(runtime: Runtime, *, limit: int = SWEEP_LIMIT) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Take the pending deliveries due for longer than the grace (their ids and turns): one statement,
    so two sweeps at once never take the same row."""
    with autocommit_scope(runtime.engine) as db:
        rows = db.execute(_TAKE_LOST, {"grace": runtime.settings.requeue_grace, "limit": limit}).all()
    return [(row.id, row.turn_id) for row in rows]


def resend_lost_deliveries(runtime: Runtime) -> int:
    """Send again the deliveries whose message was lost; returns how many were sent. Never raises:
    a row not sent now is due still, and the next sweep takes it once the grace has passed again."""
    try:
        taken = take_lost_deliveries(runtime)
    except Exception as exc:
        log.warning("lost webhook deliveries not looked for (next sweep tries again): %s", mask_secrets(str(exc))[:300])
        return 0
    sent = 0
    for delivery_id, turn_id in taken:
        try:
            send_delivery(delivery_id)
        except Exception as exc:
            log.warning(
                "turn %s: could not send webhook delivery %s again: %s", turn_id, delivery_id, mask_secrets(str(exc))
            )
            continue
        sent += 1
        log.info("turn %s: webhook delivery %s had no message; sent again", turn_id, delivery_id)
    return sent

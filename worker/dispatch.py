"""Sending task messages: `chatq.run_turn` (the one place that knows the task's name, id and routing)
and `chatq.deliver_webhook` (sending a delivery that Postgres recorded).

On the session side: a producer sends through it, and loads no module of the runtime."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from kombu.exceptions import OperationalError as KombuOperationalError
from redis import RedisError
from sqlalchemy import Engine, text

from chatq.masking import mask_secrets
from models.db import session_scope
from worker import tenant_queue
from worker.markers import sent_marker, set_markers
from worker.payload import BATCH_QUEUE, TASK_NAME, WEBHOOK_QUEUE, redacted_kwargs

if TYPE_CHECKING:
    from worker.store.turns import NextTurn

log = logging.getLogger(__name__)

WEBHOOK_TASK_NAME = "chatq.deliver_webhook"
"""The webhook delivery task's name."""

STORED_HEADER = "chatq_stored"
"""A message header chatq's own turn messages carry: their turn is stored before they are sent. A
message without it (a raw producer's) is stored by the worker before its claim
(`worker.store.claims.claim_message`), which spares that claim's certain miss."""

_PENDING_END = text(
    """
    -- Recorded with the end (`worker.store.transition_sql.end_delivery_sql`); still to be sent.
    SELECT id FROM webhook_deliveries WHERE turn_id = :turn_id AND event = 'ended' AND status = 'pending'
    """
)


def send_turn(
    message: Mapping[str, Any],
    *,
    queue: str,
    client: redis.Redis,
    countdown: float | None = None,
    tenant: str | None = None,
) -> bool:
    """Send a turn's task message (task id = turn id). False if the broker is unreachable.

    A turn that could not be sent is still `queued` in Postgres; the sweeper sends it later.
    `tenant`: its session's, when the sender knows it (see `send_turns`).
    """
    tenants = {str(message["turn_id"]): tenant} if tenant else None
    return send_turns([message], queue=queue, client=client, countdown=countdown, tenants=tenants) == 1


def send_turns(
    messages: Sequence[Mapping[str, Any]],
    *,
    queue: str,
    client: redis.Redis,
    countdown: float | None = None,
    tenants: Mapping[str, str] | None = None,
) -> int:
    """Mark many turns' messages in one pipeline (on `client`), then send them over one pooled producer.

    Returns how many were sent; the rest stay `queued` in Postgres for the sweeper. The markers go
    first: a worker drops a marker when it takes the message, and one set after the send could land
    after that and outlive the finished turn (for its whole TTL). Markers of messages that could
    not be sent are dropped again. `tenants` (turn id -> its session's tenant, where the sender
    knows it): on `chatq.batch` those messages count as waiting for their tenant until taken
    (`worker.tenant_queue`), so the workers' thread share sees tenants whose turns wait in the list.
    """
    from worker.app import app

    turn_ids = [str(message["turn_id"]) for message in messages]
    counted = dict(tenants or {}) if queue == BATCH_QUEUE else {}
    set_markers(client, turn_ids, counted)
    sent: list[str] = []
    with app.producer_or_acquire() as producer:
        for message in messages:
            try:
                app.send_task(
                    TASK_NAME,
                    kwargs=dict(message),
                    task_id=str(message["turn_id"]),
                    queue=queue,
                    countdown=countdown,
                    producer=producer,
                    # Flower and task logs show ids and sizes, never the user's words.
                    kwargsrepr=redacted_kwargs(message),
                    argsrepr="()",
                    headers={STORED_HEADER: True},
                    retry=True,
                    retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2},
                )
            except (KombuOperationalError, RedisError, OSError) as exc:
                log.warning(
                    "turn %s: could not send to queue %s (the sweeper will re-send it): %s",
                    message.get("turn_id"),
                    queue,
                    mask_secrets(str(exc)),
                )
                continue
            sent.append(str(message["turn_id"]))
    unsent = set(turn_ids).difference(sent)
    if unsent.intersection(counted):
        tenant_queue.drop_unsent(client, [sent_marker(turn_id) for turn_id in unsent.intersection(counted)])
    if unsent.difference(counted):
        with contextlib.suppress(RedisError):
            client.delete(*(sent_marker(turn_id) for turn_id in unsent.difference(counted)))
    return len(sent)


def send_next(nxt: NextTurn | None, *, client: redis.Redis, tenant: str | None = None) -> None:
    """Send a session's next turn (found when the previous one ended), so it never waits for the sweeper.
    `tenant`: the session's, when the caller knows it (`send_turns`)."""
    if nxt is not None:
        send_turn(nxt.to_message(), queue=nxt.queue, client=client, tenant=tenant or nxt.tenant)


def kick_next(session_id: uuid.UUID, *, engine: Engine, client: redis.Redis) -> None:
    """Look up and send the session's next queued turn (for paths that ended a turn elsewhere)."""
    from worker.store import turns

    try:
        nxt = turns.next_runnable(session_id, engine=engine)
    except Exception as exc:  # the sweeper covers this; never fail a finished turn over it
        log.warning("session %s: could not look up the next turn: %s", session_id, mask_secrets(str(exc)))
        return
    send_next(nxt, client=client)


def send_end_delivery(turn_id: uuid.UUID, *, engine: Engine) -> uuid.UUID | None:
    """Send the task message of an ended turn's webhook delivery, which the end recorded; its id, or
    None (no webhook, or no longer pending). If this never runs (the process died after the end's
    commit) or the message is lost, the sweep sends it (`worker.runtime.webhooks.recovery`)."""
    with session_scope(engine) as db:
        delivery_id = db.execute(_PENDING_END, {"turn_id": turn_id}).scalar_one_or_none()
    if delivery_id is None:
        return None
    send_delivery(delivery_id)
    log.info("turn %s: webhook delivery %s queued", turn_id, delivery_id)
    return uuid.UUID(str(delivery_id))


def send_delivery(delivery_id: uuid.UUID, *, countdown: float | None = None) -> None:
    """Send the delivery's task message (task id = delivery id)."""
    from worker.app import app

    app.send_task(
        WEBHOOK_TASK_NAME,
        kwargs={"delivery_id": str(delivery_id)},
        task_id=str(delivery_id),
        queue=WEBHOOK_QUEUE,
        countdown=countdown,
        retry=True,
        retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2},
    )

"""The first due step: delayed turns whose time came are queued and sent (`release_due_turns`).

Every worker runs it every CHATQ_DUE_INTERVAL seconds (`worker.runtime.recovery.due_timer`). The
release is one statement of the store (`worker.store.delayed.release_due`, SKIP LOCKED), so any
number of workers release each turn once; its task message is sent after that commit, and one
that is lost (Redis down, the process dead right after the commit) is sent again by the sweep, as
for any queued turn: the released turn is `queued` with its user message and `enqueued_at` now.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from worker.dispatch import send_turns
from worker.events import EventType, TurnEvents
from worker.store.delayed import DEFAULT_RELEASE_LIMIT, Released, release_due

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

log = logging.getLogger(__name__)

MAX_ROUNDS = 10
"""Statements one step runs at most while each releases a full `limit` (a burst of due turns)."""


def release_due_turns(runtime: Runtime, *, now: datetime | None = None, limit: int = DEFAULT_RELEASE_LIMIT) -> int:
    """Queue the delayed turns due at `now` (None: the statement's start, the database's clock), publish their `queued`
    event and send their task messages; returns how many were released. Idle: one indexed query."""
    total = 0
    for _ in range(MAX_ROUNDS):
        released = release_due(engine=runtime.engine, now=now, limit=limit)
        if released:
            _announce(runtime, released)
        total += len(released)
        if len(released) < limit:
            break
    return total


def _announce(runtime: Runtime, released: list[Released]) -> None:
    client, retention = runtime.redis, runtime.settings.event_retention
    for turn in released:
        events = TurnEvents(session_id=turn.session_id, turn_id=turn.turn_id, client=client, retention=retention)
        events.publish(EventType.QUEUED, 0, position=turn.position)
        log.info("turn %s session %s: due, queued at position %d", turn.turn_id, turn.session_id, turn.position)
    for queue in sorted({turn.queue for turn in released}):
        # Unsent ones stay `queued` in Postgres: the sweep sends them (`send_turns` logs each).
        send_turns(
            [turn.to_message() for turn in released if turn.queue == queue],
            queue=queue,
            client=client,
            tenants={str(turn.turn_id): turn.tenant for turn in released if turn.tenant},
        )

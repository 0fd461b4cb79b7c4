"""The sweeper (every worker runs it every CHATQ_SWEEP_INTERVAL seconds, worker/sweep_timer.py;
`chatq beat` can too, through the `chatq.sweep` task).

Redis is only transport and keeps nothing on disk, so Postgres is searched for turns whose
message can no longer arrive: runnable `queued` turns not sent for CHATQ_REQUEUE_GRACE seconds,
and `running` turns whose lease ran out (their worker died). Both are sent again; the claim
decides who runs them, and a turn whose workers keep dying is failed there (CHATQ_MAX_DELIVERIES).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import text

from chatq.settings import get_settings
from models.db import unpooled_connection
from worker import bindings, turns
from worker.dispatch import send_turns
from worker.markers import in_queue

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What one sweep did."""

    resent: int
    """Turns sent again (lost messages and expired leases)."""
    expired_leases: int
    """Of those, turns taken back from a worker whose lease ran out."""

    def as_dict(self) -> dict[str, int]:
        """JSON form for the task result and logs."""
        return {"resent": self.resent, "expired_leases": self.expired_leases}


def declare_queues() -> None:
    """Declare chatq's queues again and drop stray bindings (`worker.bindings`)."""
    from worker.app import app

    bindings.declare_queues(app)


def sweep_once() -> SweepReport:
    """One pass of the sweeper."""
    settings = get_settings()
    try:
        declare_queues()
    except Exception as exc:
        log.warning("could not declare the queues: %s", exc)
    resend, expired = turns.stale_turns(grace_seconds=settings.requeue_grace, in_queue=in_queue)
    for queue in {turn.queue for turn in resend}:
        send_turns([turn.to_message() for turn in resend if turn.queue == queue], queue=queue)
    from worker import metrics

    metrics.SWEEPER.labels("resent").inc(len(resend) - len(expired))
    metrics.SWEEPER.labels("expired_lease").inc(len(expired))
    for turn_id in expired:
        log.warning("turn %s: lease expired, handed to another worker", turn_id)
    if resend:
        log.info("sweeper re-sent %d turn(s), %d after an expired lease", len(resend), len(expired))
    return SweepReport(resent=len(resend), expired_leases=len(expired))


SWEEP_LOCK_KEY = int.from_bytes(b"chatq.sw", "big")
"""The Postgres advisory lock that one sweep at a time holds (locks are per database, so chatq
deployments sharing a server never meet)."""


@contextmanager
def sweep_lock() -> Iterator[bool]:
    """Take the sweep lock for the block if nobody holds it; yields whether this caller got it.

    Never waits: a worker (or beat) that does not get it skips this round. The lock is a
    session-level Postgres advisory lock, not a Redis key with an expiry: the sweep's data lives in
    Postgres, a Redis that lost its keys (when sweeps matter most) cannot drop the lock under a
    running sweep, and Postgres itself releases it when the holder's connection ends, even under
    `kill -9`, so there is no expiry to tune against the longest sweep. The connection is its own
    (never pooled) and closing it at the end of the block is what releases the lock.
    """
    with unpooled_connection() as connection:
        held = bool(connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": SWEEP_LOCK_KEY}))
        try:
            yield held
        finally:
            if held:
                # Released now, not when the server gets round to ending the closed session's
                # backend: the next sweeper (or this one's next round) must find it free.
                with contextlib.suppress(Exception):
                    connection.scalar(text("SELECT pg_advisory_unlock(:key)"), {"key": SWEEP_LOCK_KEY})


def sweep_exclusively() -> SweepReport | None:
    """One sweep unless another worker or beat is sweeping now (then None: this round is skipped)."""
    with sweep_lock() as held:
        if not held:
            log.debug("sweep skipped: another process holds the sweep lock")
            return None
        return sweep_once()

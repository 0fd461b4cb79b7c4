"""The sweeper (every worker runs it every CHATQ_SWEEP_INTERVAL seconds, worker/runtime/recovery/sweep_timer.py;
`chatq beat` can too, through the `chatq.sweep` task).

Redis is only transport and keeps nothing on disk, so Postgres is searched for turns whose
message can no longer arrive: runnable `queued` turns not sent for CHATQ_REQUEUE_GRACE seconds
whose message is not waiting in a queue (`worker.markers.still_waiting`: a message taken
by a worker that stopped before running it counts as lost), and `running` turns whose lease ran
out (their worker died). Both are sent again; the claim
decides who runs them, and a turn whose workers keep dying is failed there (CHATQ_MAX_DELIVERIES).
It also publishes the terminal event of a turn that ended but whose publisher died before sending
it (`repair_terminal_events`), and sends again the webhook deliveries whose task message was lost
(`worker.runtime.webhooks.recovery`).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import redis
from sqlalchemy import Engine, and_, func, or_, select, text
from sqlalchemy.orm import Session

from chatq.masking import mask_secrets
from chatq.settings import Settings
from models.db import session_scope, unpooled_connection
from models.tables import ChatMessage, ChatSession, Turn, TurnStatus
from worker import tenant_queue, unacked
from worker.dispatch import send_next, send_turns
from worker.markers import still_waiting
from worker.runtime.intake import bindings
from worker.runtime.observers.hook_points import SweepRepaired, SweepResent
from worker.runtime.recovery import terminal_repair
from worker.runtime.webhooks.recovery import resend_lost_deliveries
from worker.store import approvals, claims
from worker.store.turns import NextTurn, runs_next

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What one sweep did."""

    resent: int
    """Turns sent again (lost messages and expired leases)."""
    expired_leases: int
    """Of those, turns taken back from a worker whose lease ran out."""
    purged: int = 0
    """Sessions deleted for being idle past CHATQ_RETENTION_DAYS."""
    repaired: int = 0
    """Ended turns whose missing terminal event was published (`repair_terminal_events`)."""
    timed_out: int = 0
    """Paused turns whose approval deadline passed: their calls denied "timed out", the turns sent again."""
    webhooks: int = 0
    """Webhook deliveries whose task message was lost, sent again."""

    def as_dict(self) -> dict[str, int]:
        """JSON form for the task result and logs."""
        return {
            "resent": self.resent,
            "expired_leases": self.expired_leases,
            "purged": self.purged,
            "repaired": self.repaired,
            "timed_out": self.timed_out,
            "webhooks": self.webhooks,
        }


def declare_queues(client: redis.Redis) -> None:
    """Declare chatq's queues again and drop stray bindings (`worker.runtime.intake.bindings`)."""
    from worker.app import app

    bindings.declare_queues(app, client)


def sweep_once(runtime: Runtime) -> SweepReport:
    """One pass of the sweeper, by the runtime's settings, on its connections."""
    settings, client = runtime.settings, runtime.redis
    try:
        declare_queues(client)
    except Exception as exc:
        log.warning("could not declare the queues: %s", exc)
    stuck: dict[uuid.UUID, list[bytes]] = {}
    resend, expired = stale_turns(
        engine=runtime.engine,
        renewal_interval=settings.renewal_interval,
        grace_seconds=settings.requeue_grace,
        in_queue=lambda turn_ids: still_waiting(client, turn_ids, grace=settings.requeue_grace, stuck=stuck),
    )
    forget_stuck_copies(client, [tag for turn in resend for tag in stuck.get(turn.turn_id, ())])
    tenants = {str(turn.turn_id): turn.tenant for turn in resend if turn.tenant}
    for queue in {turn.queue for turn in resend}:
        messages = [turn.to_message() for turn in resend if turn.queue == queue]
        send_turns(messages, queue=queue, client=client, tenants=tenants)
    runtime.hooks.sweep_resent(SweepResent(resent=len(resend) - len(expired), expired_leases=len(expired)))
    for turn_id in expired:
        log.warning("turn %s: lease expired, handed to another worker", turn_id)
    if resend:
        log.info("sweeper re-sent %d turn(s), %d after an expired lease", len(resend), len(expired))
    repaired = repair_terminal_events(runtime)
    forget_idle_tenants(runtime)
    return SweepReport(
        resent=len(resend),
        expired_leases=len(expired),
        purged=purge_expired(settings),
        repaired=repaired,
        timed_out=time_out_approvals(runtime),
        webhooks=resend_lost_deliveries(runtime),
    )


_QUEUED_TENANTS = text(
    """
    SELECT DISTINCT s.tenant FROM turns t JOIN chat_sessions s ON s.id = t.session_id
    WHERE t.status = 'queued' AND t.queue = 'chatq.batch' AND s.tenant IS NOT NULL
    """
)


def forget_idle_tenants(runtime: Runtime) -> int:
    """Drift bound of the tenants' waiting batch messages (`worker.tenant_queue`): the count of a tenant
    with no batch turn queued in Postgres is set to 0; returns how many."""
    try:
        with session_scope(runtime.engine) as db:
            queued = {str(tenant) for tenant in db.execute(_QUEUED_TENANTS).scalars()}
        return tenant_queue.forget_idle(runtime.redis, queued)
    except Exception as exc:  # the counts only steer the threads' share: never let it break a sweep
        log.warning("tenants' queued counts not checked (next sweep tries again): %s", mask_secrets(str(exc))[:300])
        return 0


def time_out_approvals(runtime: Runtime) -> int:
    """Deny the undecided calls of paused turns whose deadline passed ("timed out", the documented
    default) and send those turns again; returns how many turns."""
    resumed = 0
    try:
        for turn_id in approvals.expired_approvals(engine=runtime.engine):
            decided = approvals.decide_calls(turn_id, None, engine=runtime.engine)
            if decided.resumed:
                resumed += 1
                log.info("turn %s: approval deadline passed; its calls were denied", turn_id)
                send_next(decided.next_turn, client=runtime.redis)
    except Exception as exc:  # as for the repair: the next sweep tries again
        log.warning("approval deadlines not applied (next sweep tries again): %s", mask_secrets(str(exc))[:300])
    return resumed


def repair_terminal_events(runtime: Runtime) -> int:
    """Publish the terminal events of ended turns whose publisher died before it did
    (`worker.runtime.recovery.terminal_repair`); returns how many."""
    try:
        repaired = terminal_repair.publish_missing_terminal_events(
            engine=runtime.engine, client=runtime.redis, retention=runtime.settings.event_retention
        )
    except Exception as exc:  # like retention: never let it break the re-sending of a sweep
        log.warning(
            "terminal event repair failed (next sweep tries again): %s",
            (mask_secrets(str(exc)).splitlines() or [type(exc).__name__])[0],
        )
        return 0
    runtime.hooks.sweep_repaired(SweepRepaired(events=len(repaired)))
    return len(repaired)


def forget_stuck_copies(client: redis.Redis, tags: Sequence[bytes]) -> None:
    """Drop the copies of re-sent turns stuck in kombu's unacked set, so none comes back in an hour."""
    if not tags:
        return
    try:
        unacked.forget(client, tags)
    except Exception as exc:  # a stale copy only makes a harmless duplicate after the visibility timeout
        log.warning("could not drop %d stuck message copies: %s", len(tags), mask_secrets(str(exc)))


def purge_expired(settings: Settings) -> int:
    """Retention: sessions idle past CHATQ_RETENTION_DAYS (unset: none), then old deleted-session digests."""
    from worker import deletion

    retention_days = settings.retention_days
    purged = 0
    try:
        if retention_days is not None:
            purged = deletion.purge_idle_sessions(retention_days)
        deletion.purge_tombstones()
    except Exception as exc:  # the re-sending above matters more: never let retention break a sweep
        log.warning(
            "retention purge failed (next sweep tries again): %s",
            (mask_secrets(str(exc)).splitlines() or [type(exc).__name__])[0],
        )
    return purged


def _next_turn(db: Session, turn: Turn) -> NextTurn:
    user = db.execute(
        select(ChatMessage.content, ChatMessage.images).where(
            ChatMessage.turn_id == turn.id, ChatMessage.role == "user"
        )
    ).one_or_none()
    # The session's tenant: a tenant's batch turn counts as waiting for it (`worker.tenant_queue`).
    tenant = db.execute(select(ChatSession.tenant).where(ChatSession.id == turn.session_id)).scalar_one_or_none()
    return NextTurn(
        turn_id=turn.id,
        session_id=turn.session_id,
        queue=turn.queue,
        content=user.content if user is not None else "",
        images=tuple(user.images) if user is not None and user.images else None,
        reply_to=turn.reply_to,
        tenant=tenant,
    )


def stale_turns(
    *,
    engine: Engine,
    renewal_interval: float,
    grace_seconds: float,
    in_queue: Callable[[Sequence[uuid.UUID]], set[uuid.UUID]] | None = None,
    patience: float = 10.0,
    limit: int = 2000,
) -> tuple[list[NextTurn], list[uuid.UUID]]:
    """Runnable queued turns not sent for `grace_seconds`, and turns whose lease expired.

    `in_queue` tells which queued turns still have their message waiting in Redis: those are only
    slow (workers are busy), not lost, and are re-sent only after `patience` times the grace, so a
    long backlog is not multiplied by every sweep. Expired leases are released back to `queued`
    here (`claims.take_over`, so the re-sent message can claim them), and everything returned is
    marked as sent now, so overlapping sweeps do not send twice. `renewal_interval` is the settings'
    (`claims.record_stops`).
    """
    with session_scope(engine) as db:
        now = db.execute(select(func.now())).scalar_one()
        rows = (
            db.execute(
                select(Turn)
                .where(
                    or_(
                        and_(
                            Turn.status == TurnStatus.QUEUED,
                            Turn.enqueued_at < now - timedelta(seconds=grace_seconds),
                            runs_next(),
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
        running = [turn.id for turn in rows if turn.status is TurnStatus.RUNNING]
        released = set(claims.take_over(db, running, renewal_interval=renewal_interval))
        expired = [turn.id for turn in rows if turn.id in released]
        resend: list[NextTurn] = []
        for turn in rows:
            if turn.id in released:
                resend.append(_next_turn(db, turn))
                continue
            if turn.id in queued_in_redis and turn.enqueued_at is not None and turn.enqueued_at > patience_cutoff:
                continue
            turn.enqueued_at = now
            resend.append(_next_turn(db, turn))
        return resend, expired


SWEEP_LOCK_KEY = int.from_bytes(b"chatq.sw", "big")
"""The Postgres advisory lock that one sweep at a time holds (locks are per database, so chatq
deployments sharing a server never meet)."""


@contextmanager
def sweep_lock(*, frozen_after: float | None = None) -> Iterator[bool]:
    """Take the sweep lock for the block if nobody holds it; yields whether this caller got it.

    Never waits: a worker (or beat) that does not get it skips this round. The lock is a
    session-level Postgres advisory lock, not a Redis key with an expiry: the sweep's data lives in
    Postgres, a Redis that lost its keys (when sweeps matter most) cannot drop the lock under a
    running sweep, and Postgres itself releases it when the holder's connection ends, even under
    `kill -9`, so there is no expiry to tune against the longest sweep. The connection is its own
    (never pooled) and closing it at the end of the block is what releases the lock.

    A holder that stops running without dying (frozen by SIGSTOP, a paused VM, a process stuck in
    swap) keeps its connection, and the lock with it: no sweep would run anywhere, and no turn
    whose lease runs out would be taken over. With `frozen_after` (seconds; Postgres 14 or later)
    Postgres ends the lock's session once it has been idle that long (`idle_session_timeout`):
    the lock connection of a live sweep is idle while the sweep works on other connections, so
    `frozen_after` must be longer than a sweep ever takes; a sweep that outlasts it loses only
    the lock (another may start beside it), not its work.
    """
    with unpooled_connection() as connection:
        if frozen_after is not None and (connection.dialect.server_version_info or (0,)) >= (14,):
            connection.execute(text(f"SET idle_session_timeout = {max(int(frozen_after * 1000), 1)}"))
        held = bool(connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": SWEEP_LOCK_KEY}))
        try:
            yield held
        finally:
            if held:
                # Released now, not when the server gets round to ending the closed session's
                # backend: the next sweeper (or this one's next round) must find it free.
                with contextlib.suppress(Exception):
                    connection.scalar(text("SELECT pg_advisory_unlock(:key)"), {"key": SWEEP_LOCK_KEY})


def sweep_exclusively(runtime: Runtime) -> SweepReport | None:
    """One sweep unless another worker or beat is sweeping now (then None: this round is skipped)."""
    settings = runtime.settings
    # Longer than any sweep; a frozen holder then delays takeovers by about one lease more.
    with sweep_lock(frozen_after=max(settings.lease_seconds, 2 * settings.sweep_interval)) as held:
        if not held:
            log.debug("sweep skipped: another process holds the sweep lock")
            return None
        return sweep_once(runtime)

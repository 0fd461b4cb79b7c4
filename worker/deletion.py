"""Deleting sessions: on request (`delete_session`) and by retention (`purge_idle_sessions`, in the sweep).
On the session side, beside `worker.sessions`: a producer that deletes loads no runtime.

A deletion stops the session's turns first (queued ones end `cancelled`, running ones are asked to
stop and given a moment to do so), then removes, in one transaction, the session and everything
of it: turns, messages, knowledge-base attachments (cascades) and paid tool-call records. Kept,
without content or ids, is what billing needs (`usage_rollups`: token and paid-tool totals per
day, tenant, model and tool), and the SHA-256 digest of the session id (`deleted_sessions`, for
TOMBSTONE_DAYS) so that a task message of it still in Redis does not create it again. Then what
Redis holds of it goes: each turn's replay stream, sent-marker and provider-limit entries.

A turn still running when its rows went (its worker had not stopped yet) loses its lease: it stores
nothing, and `ForgetDeletedTurns` (a lifecycle hook, `worker.runtime.observers.deleted_turns`) removes the
events it published meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis import RedisError
from sqlalchemy import ARRAY, String, Uuid, bindparam, cast, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from chatq.masking import mask_secrets
from models.db import session_scope
from models.tables import ChatSession, DeletedSession, PaidToolCall, Turn, TurnStatus
from worker.event_scripts import UNENDED, ended_marker
from worker.events import get_redis, turn_stream
from worker.history import scoped_session
from worker.markers import sent_marker
from worker.payload import parse_uuid
from worker.store import claims, turns

__all__ = [
    "DEFAULT_STOP_WAIT",
    "TOMBSTONE_DAYS",
    "DeletedSessionReport",
    "delete_session",
    "forget_turns",
    "purge_idle_sessions",
    "purge_tombstones",
]

log = logging.getLogger(__name__)

DEFAULT_STOP_WAIT = 5.0
"""Seconds `delete_session` waits for its running turns to stop before it deletes them anyway."""

TOMBSTONE_DAYS = 30
"""Days the digest of a deleted session's id is kept (longer than any message waits in Redis)."""

PURGE_BATCH = 50
"""Sessions one retention transaction deletes: a short transaction, row locks only."""

PURGE_BATCHES = 20
"""Transactions one sweep spends on retention at most; the rest waits for the next sweep."""

ROLLUP = text(
    """
    WITH tokens AS (
        INSERT INTO usage_rollups (day, tenant, model, tool_name, turns, prompt_tokens, completion_tokens,
                                   total_tokens, reason)
        SELECT (t.created_at AT TIME ZONE 'UTC')::date, s.tenant, s.model, NULL, count(*),
               sum(t.prompt_tokens), sum(t.completion_tokens), sum(t.total_tokens), :reason
        FROM turns t JOIN chat_sessions s ON s.id = t.session_id
        WHERE t.session_id = ANY(:session_ids)
        GROUP BY 1, 2, 3
        RETURNING 1
    )
    INSERT INTO usage_rollups (day, tenant, model, tool_name, tool_calls, tool_units, tool_cost, reason)
    SELECT (p.created_at AT TIME ZONE 'UTC')::date, s.tenant, s.model, p.tool_name, count(*),
           sum(p.units), sum(p.cost), :reason
    FROM paid_tool_calls p JOIN chat_sessions s ON s.id = p.session_id
    WHERE p.session_id = ANY(:session_ids)
    GROUP BY 1, 2, 3, 4
    """
).bindparams(bindparam("session_ids", type_=ARRAY(Uuid)))
"""Usage of the sessions about to be deleted, summed per day, tenant, model (and paid tool)."""

IDLE_SESSIONS = text(
    """
    SELECT s.id FROM chat_sessions s
    WHERE s.last_active_at < now() - make_interval(secs => :idle_seconds)
      AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id AND t.status IN ('queued', 'running', 'delayed'))
    ORDER BY s.last_active_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)
"""Sessions idle past retention with no unfinished turn; rows another transaction holds are skipped."""


@dataclass(frozen=True, kw_only=True)
class DeletedSessionReport:
    """What `delete_session` did."""

    session_id: uuid.UUID
    """The deleted session."""
    turns: int
    """Turns deleted with it."""
    stopped: list[uuid.UUID]
    """Unfinished turns it stopped first (queued ones cancelled, running ones asked to stop)."""


def delete_session(
    session_id: uuid.UUID | str, *, tenant: str | None = None, stop_wait: float = DEFAULT_STOP_WAIT
) -> DeletedSessionReport:
    """Stop a session's turns, then delete it with everything of it (see the module docstring).

    SessionNotFound if it does not exist (or, with `tenant`, is another tenant's).
    """
    from worker.waiting import wait_for_ends

    session_uuid = parse_uuid(str(session_id), "session_id")
    with session_scope() as db:
        scoped_session(db, session_uuid, tenant, lock=True)
        active = list(db.execute(select(Turn.id).where(Turn.session_id == session_uuid, turns.unfinished())).scalars())
        stopped = claims.request_cancel(db, active)
    running = [turn_id for turn_id, status in stopped.items() if status is TurnStatus.RUNNING]
    if running and stop_wait > 0:
        # Their workers notice within about a second and end them `cancelled`, storing nothing.
        with contextlib.suppress(RedisError):
            wait_for_ends(running, timeout=stop_wait)
    with session_scope() as db:
        scoped_session(db, session_uuid, tenant, lock=True)
        deleted = _delete_sessions(db, [session_uuid], reason="deleted")
    # A queued turn cancelled above is finished, but its message (and marker) may still wait in the queue.
    forget_turns(deleted.ids, finished=deleted.finished - {str(turn_id) for turn_id in stopped})
    log.info("session %s deleted with %d turn(s), %d stopped first", session_uuid, len(deleted.ids), len(stopped))
    return DeletedSessionReport(session_id=session_uuid, turns=len(deleted.ids), stopped=list(stopped))


def _delete_sessions(db: Session, session_ids: Sequence[uuid.UUID], *, reason: str) -> DeletedTurns:
    """Roll up the usage of these (locked) sessions, delete them, keep their digests; returns their turns."""
    # The ids come back as text: what Redis needs, without a UUID object per turn on the way.
    rows = db.execute(select(cast(Turn.id, String), Turn.status).where(Turn.session_id.in_(session_ids))).all()
    db.execute(ROLLUP, {"session_ids": list(session_ids), "reason": reason})
    db.execute(delete(PaidToolCall).where(PaidToolCall.session_id.in_(session_ids)))
    # Turns, messages and knowledge-base attachments go with the session (ON DELETE CASCADE).
    db.execute(delete(ChatSession).where(ChatSession.id.in_(session_ids)))
    db.execute(
        pg_insert(DeletedSession)
        .values([{"digest": DeletedSession.digest_of(session_id)} for session_id in session_ids])
        .on_conflict_do_nothing()
    )
    return DeletedTurns(
        ids=[turn_id for turn_id, _ in rows],
        finished=frozenset(turn_id for turn_id, status in rows if TurnStatus(status).finished),
    )


@dataclass(frozen=True, kw_only=True)
class DeletedTurns:
    """The turns a deletion removed, as `forget_turns` takes them."""

    ids: list[str]
    """Every deleted turn's id."""
    finished: frozenset[str]
    """Those of them that had finished before the deletion (see `forget_turns`)."""


PAGE = 500
"""Keys or members per Redis command when forgetting turns."""

STREAM_PREFIX, ENDED_PREFIX = turn_stream(""), ended_marker("")
"""`turn_stream(id)` and `ended_marker(id)` are these plus the id (built here by concatenation:
10,000 calls of the functions cost more than the Redis commands they feed)."""

LIMIT_SETS = "chatq:limits:*"
"""The provider limits' per-model sets (`worker.runtime.policy.limits.Scope.keys`): their members name turns."""


def forget_turns(
    turn_ids: Sequence[uuid.UUID | str],
    *,
    finished: Collection[str] = frozenset(),
    client: redis.Redis | None = None,
) -> None:
    """Remove what Redis holds of deleted turns (best effort, in pages): their replay streams and
    ended-markers; and of those not in `finished`, their sent-markers, places in the unended set and
    entries in the provider limits' slot and waiting sets. On `client` (a worker's), else the process's.

    A turn that had finished holds none of the latter: its marker went when a worker took its
    message, its place when its terminal event went out, its slot when it ended. Whatever a crash
    left behind names a turn that no longer exists and lapses (the marker's TTL, the slots'), and the
    sweep drops a place of a turn that is gone. Skipping them keeps deleting a long session's Redis
    part at two keys a turn.
    """
    if not turn_ids:
        return
    client = client or get_redis()
    names = [str(turn_id) for turn_id in turn_ids]
    unsettled = [name for name in names if name not in finished]
    try:
        for start in range(0, len(names), PAGE):
            page = names[start : start + PAGE]
            client.unlink(*[f"{STREAM_PREFIX}{name}" for name in page], *[f"{ENDED_PREFIX}{name}" for name in page])
        for start in range(0, len(unsettled), PAGE):
            page = unsettled[start : start + PAGE]
            client.unlink(*[sent_marker(name) for name in page])
            client.zrem(UNENDED, *page)
        _forget_in_limits(client, unsettled, set(names))
    except RedisError as exc:
        # Left behind, they expire by themselves (CHATQ_EVENT_RETENTION, the markers' and the limits'
        # TTLs), and the sweep drops places in the unended set of turns that no longer exist.
        log.warning("could not remove the Redis keys of %d deleted turn(s): %s", len(names), _line(exc))


def _forget_in_limits(client: Any, unsettled: Sequence[str], ids: set[str]) -> None:
    """Slots and waiters are the turn ids (only unfinished turns hold them); the sent log's members
    are `turn_id:ms` (a few seconds' worth, of any turn)."""
    members = sorted(unsettled)
    for raw in client.scan_iter(match=LIMIT_SETS, count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if key.endswith((":slots", ":iwait")):
            for start in range(0, len(members), PAGE):
                client.zrem(key, *members[start : start + PAGE])
        elif key.endswith(":sent"):
            logged = [m.decode() if isinstance(m, bytes) else str(m) for m in client.zrange(key, 0, -1)]
            gone = [member for member in logged if member.rpartition(":")[0] in ids]
            if gone:
                client.zrem(key, *gone)


def purge_idle_sessions(idle_days: float, *, batch: int = PURGE_BATCH, batches: int = PURGE_BATCHES) -> int:
    """Delete sessions idle longer than `idle_days` (CHATQ_RETENTION_DAYS) in short transactions; returns how many.

    Each transaction takes at most `batch` idle sessions without unfinished turns, skipping any
    row another transaction holds (a turn being submitted), and gives up on a lock it would have
    to wait for, so a busy table is never held up for long.
    """
    purged = 0
    for _ in range(batches):
        with session_scope() as db:
            db.execute(text("SET LOCAL lock_timeout = '2s'"))
            ids = list(db.execute(IDLE_SESSIONS, {"idle_seconds": idle_days * 86_400, "limit": batch}).scalars())
            if not ids:
                break
            deleted = _delete_sessions(db, ids, reason="retention")
        forget_turns(deleted.ids, finished=deleted.finished)
        purged += len(ids)
        if len(ids) < batch:
            break
    if purged:
        log.info("retention: purged %d session(s) idle for over %g day(s)", purged, idle_days)
    return purged


def purge_tombstones(*, limit: int = 1000) -> int:
    """Forget the digests of sessions deleted over TOMBSTONE_DAYS ago (at most `limit` per call)."""
    with session_scope() as db:
        old = (
            select(DeletedSession.digest)
            .where(DeletedSession.deleted_at < func.now() - text(f"interval '{TOMBSTONE_DAYS} days'"))
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        result = db.execute(delete(DeletedSession).where(DeletedSession.digest.in_(old.scalar_subquery())))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _line(exc: BaseException) -> str:
    return (mask_secrets(str(exc)).splitlines() or [type(exc).__name__])[0]

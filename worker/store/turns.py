"""Turn rows in Postgres, read side: sessions, the rule of which turn a session runs next, finding
that turn, and which crashes of a turn's workers count against it (poison).

Postgres is the source of truth. Every change of a turn's status is made in `worker.store.claims`
(the one module that writes `turns.status`); this module only reads, and marks a turn as sent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Boolean, ColumnElement, Connection, Engine, FromClause, RowMapping, literal_column, select, text
from sqlalchemy.orm import Session

from models.db import connection_scope, session_scope
from models.tables import ACTIVE_STATUSES, ChatMessage, ChatSession, Turn
from worker.errors import InvalidTurn, SessionNotFound, TenantMismatch
from worker.payload import TurnRequest

log = logging.getLogger(__name__)


UNFINISHED_SQL = "IN ({})".format(", ".join(f"'{status}'" for status in ACTIVE_STATUSES))
"""`status <this>` holds for an unfinished turn. Literal values, as in the partial index
`ix_turns_active_by_session`, so the planner can use that index for every query built on it."""


def runs_next_sql(turn: str = "turns", *, besides: str | None = None) -> str:
    """The rule of turn order, as SQL about the turn row named `turn`: it is the turn its session
    runs next, the first unfinished one (unfinished, and no earlier turn of its session is).

    The one definition: every statement that asks "may this turn run, what runs next, where does
    the session stand" is built on it (`worker.store.transition_sql` composes it into its statements).
    `besides` (an SQL expression) names a turn to count as finished: one the same statement ends,
    which its snapshot still sees unfinished.
    """
    other = "" if besides is None else f" AND earlier.id <> {besides}"
    # Composed of constants and the callers' fixed names only, never of values.
    return f"""({turn}.status {UNFINISHED_SQL} AND NOT EXISTS (
        SELECT 1 FROM turns earlier WHERE earlier.session_id = {turn}.session_id
          AND earlier.position < {turn}.position AND earlier.status {UNFINISHED_SQL}{other}))"""  # noqa: S608


def runs_next(turn: FromClause | None = None) -> ColumnElement[bool]:
    """`runs_next_sql` as a SQLAlchemy condition on `turn` (the `turns` table unless an alias is given)."""
    name = "turns" if turn is None else str(getattr(turn, "name", "turns"))
    return literal_column(runs_next_sql(name), Boolean)


def unfinished() -> ColumnElement[bool]:
    """The condition that a row of `turns` is unfinished (queued or running)."""
    return literal_column(f"turns.status {UNFINISHED_SQL}", Boolean)


def lock_session(db: Session, session_id: uuid.UUID) -> ChatSession:
    """Lock a session row for this transaction (FOR NO KEY UPDATE: foreign-key checks still pass)."""
    row = db.execute(
        select(ChatSession).where(ChatSession.id == session_id).with_for_update(key_share=True)
    ).scalar_one_or_none()
    if row is None:
        raise SessionNotFound(f"session {session_id} does not exist")
    return row


def check_reply_to(db: Session | Connection, session_id: uuid.UUID, reply_to: int | None) -> None:
    """reply_to must be a user message of the same session."""
    if reply_to is None:
        return
    role = db.execute(
        select(ChatMessage.role).where(ChatMessage.id == reply_to, ChatMessage.session_id == session_id)
    ).scalar_one_or_none()
    if role is None:
        raise InvalidTurn(f"reply_to {reply_to} is not a message of session {session_id}")
    if role != "user":
        raise InvalidTurn(f"reply_to {reply_to} is a {role} message; it must be a user message")


def check_tenant(db: Session | Connection, session_id: uuid.UUID, tenant: str | None) -> None:
    """TenantMismatch if `tenant` is given and the session exists with another tenant (or none).

    The insert statements store nothing for such a session (their `:tenant` condition); this says
    why, after the fact, so it costs a query only when nothing was stored. A session's tenant never
    changes, so the answer cannot go stale between the two.
    """
    if tenant is None:
        return
    row = db.execute(select(ChatSession.tenant).where(ChatSession.id == session_id)).one_or_none()
    if row is not None and row.tenant != tenant:
        owner = f"tenant {row.tenant!r}" if row.tenant is not None else "no tenant"
        raise TenantMismatch(f"session {session_id} belongs to {owner}, not to tenant {tenant!r}; nothing was stored")


def turn_exists(turn_id: uuid.UUID, *, engine: Engine) -> bool:
    """Whether a turn row exists."""
    with session_scope(engine) as db:
        return db.get(Turn, turn_id) is not None


@dataclass(frozen=True, kw_only=True)
class NextTurn(TurnRequest):
    """The turn that may run next in a session: its task message (`to_message`) and its queue."""

    queue: str
    """The queue to send it on."""

    @classmethod
    def from_row(cls, row: RowMapping) -> NextTurn:
        """From a row of `next_runnable_sql` (id, session_id, queue, reply_to, content, images)."""
        return cls(
            turn_id=row["id"],
            session_id=row["session_id"],
            queue=row["queue"],
            content=row["content"],
            images=tuple(row["images"]) if row["images"] else None,
            reply_to=row["reply_to"],
        )


def next_runnable_sql(*, besides: str | None = None, when: str | None = None) -> str:
    """The statement that finds a session's head turn if it is queued and marks it as sent now.

    The one definition: `next_in` runs it alone, and `worker.store.transition_sql.COMPLETE` composes
    it as the step that finds the next turn of the turn it ends (`besides`, see `runs_next_sql`),
    run only `when` (an SQL condition) holds. It returns the columns `NextTurn.from_row` reads.
    """
    guard = "" if when is None else f"{when}\n      AND "
    # Composed of constants and the callers' fixed names only, never of values.
    return f"""UPDATE turns t SET enqueued_at = clock_timestamp()
    FROM chat_messages m
    WHERE {guard}t.session_id = :session_id AND t.status = 'queued' AND {runs_next_sql("t", besides=besides)}
      AND m.turn_id = t.id AND m.role = 'user'
    RETURNING t.id, t.session_id, t.queue, t.reply_to, m.content, m.images"""  # noqa: S608


_NEXT_RUNNABLE = text(next_runnable_sql())


def next_in(db: Session | Connection, session_id: uuid.UUID) -> NextTurn | None:
    """The session's head turn if it is queued (nothing runs before it), marked as sent now."""
    row = db.execute(_NEXT_RUNNABLE, {"session_id": session_id}).mappings().one_or_none()
    return None if row is None else NextTurn.from_row(row)


def next_runnable(session_id: uuid.UUID, *, engine: Engine) -> NextTurn | None:
    """`next_in` in a transaction of its own."""
    with connection_scope(engine) as db:
        return next_in(db, session_id)


class CrashCounts(Protocol):
    """What the poison rule reads of a turn: a `Turn` row, or a row of `WHY_NOT_CLAIMED`."""

    @property
    def deliveries(self) -> int: ...
    @property
    def lone_crashes(self) -> int: ...
    @property
    def crash_hosts(self) -> Sequence[str]: ...


def poison_sql(turn: str = "t") -> str:
    """`poison_reason` is not None, as SQL about the turn row named `turn` (`:max_deliveries` bound).

    The one definition in SQL: the claim statement takes only turns for which it is false, and the
    claim's poison transition ends only turns for which it is true (`worker.store.transition_sql`).
    """
    return (
        f"({turn}.lone_crashes >= :max_deliveries"
        f" OR (cardinality({turn}.crash_hosts) >= 2 AND {turn}.deliveries >= :max_deliveries))"
    )


def poison_reason(turn: CrashCounts, *, max_deliveries: int) -> str | None:
    """Why a turn whose workers kept stopping is failed as poison, or None while it is not.

    `deliveries` counts the crashed deliveries since the turn's last clean end. A crash counts
    against the turn only when the turn is its likely cause: it was the only turn running on the
    worker that stopped (`lone_crashes`), or it stopped workers on more than one host (then every
    crash counts). A turn that merely ran beside others on a worker that died is not counted.
    `poison_sql` is the same rule in SQL: keep the two agreeing.
    """
    limit = f"(CHATQ_MAX_DELIVERIES={max_deliveries})"
    if turn.lone_crashes >= max_deliveries:
        if turn.lone_crashes == turn.deliveries:
            times = f"each of the {turn.deliveries} times its worker stopped"
        else:
            times = f"{turn.lone_crashes} of the {turn.deliveries} times its worker stopped"
        return f"the turn was abandoned: it was the only turn running {times} {limit}"
    if len(turn.crash_hosts) >= 2 and turn.deliveries >= max_deliveries:
        return (
            f"the turn was abandoned: it stopped workers on {len(turn.crash_hosts)} hosts, "
            f"{turn.deliveries} times in all {limit}"
        )
    return None


_RECOUNT_HISTORY_TOTALS = text(
    """
    UPDATE turns t
    SET history_turns = totals.turns, history_messages = totals.messages
    FROM (
        SELECT s.id,
               count(*) OVER w AS turns,
               sum(coalesce(m.messages, 0)) OVER w AS messages
        FROM turns s
        LEFT JOIN (SELECT turn_id, count(*) AS messages FROM chat_messages GROUP BY turn_id) m ON m.turn_id = s.id
        WHERE s.session_id = :session_id AND s.status = 'succeeded'
        WINDOW w AS (PARTITION BY s.session_id ORDER BY s.position)
    ) totals
    WHERE t.id = totals.id
    """
)


def recount_history_totals(db: Session | Connection, session_id: uuid.UUID) -> None:
    """Set the running history totals of a session's succeeded turns from its rows.

    `complete_turn` keeps them as turns succeed; this is for rows written another way (imports,
    test fixtures, the benchmarks' seeded sessions), as migration 0003 did for existing ones.
    """
    db.execute(_RECOUNT_HISTORY_TOTALS, {"session_id": session_id})

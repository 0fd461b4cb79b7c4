"""Firing schedules: each due tick becomes one turn, exactly once, whichever worker fires it.

`fire_due_schedules` takes the due schedules (`enabled AND next_run_at <= now`) FOR UPDATE SKIP
LOCKED, so firers running at once (every worker's timer) share them out instead of waiting. In the
same transaction it stores each tick's turn through the producer's storing path
(`claims.insert_turn`), under a turn id derived from the schedule and the tick (uuid5) so a tick
can never make two turns (an insert that conflicts inserts nothing), and advances the schedule
(`next_run_at`, `runs`, `skipped`, `last_run_at`; disabled once past `end_at` or `max_runs`).
The turns are sent after the commit: a send lost then (Redis down, the process killed) leaves a
queued turn that the sweep sends like any other.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy import Engine, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from chatq.masking import mask_secrets
from models.db import session_scope
from models.tables import ChatSession, Schedule, Turn
from worker.dispatch import send_turn
from worker.errors import SessionNotFound, TurnExists
from worker.events import EventType, TurnEvents
from worker.payload import INTERACTIVE_QUEUE, TurnRequest
from worker.runtime.observers.hook_points import ScheduleFired, ServiceHooks
from worker.schedule_records import timing_of
from worker.schedule_times import Misfire, Overlap, plan_ticks
from worker.store import claims, turns

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

__all__ = ["FIRE_LIMIT", "fire_due_schedules", "tick_turn_id"]

log = logging.getLogger(__name__)

FIRE_LIMIT = 100
"""Most schedules one pass fires; the rest stay due for the next pass (or another firer)."""

_TICKS = uuid.UUID("5b1d6c1e-2f7e-4d0c-9a3e-6f0c8a1d2b47")
"""The uuid5 namespace of tick turn ids (and of a template run's session id)."""


def tick_turn_id(schedule_id: uuid.UUID, tick: datetime) -> uuid.UUID:
    """The id of the turn of `schedule_id`'s tick at `tick` (the same whoever fires it)."""
    return uuid.uuid5(_TICKS, f"{schedule_id}/{tick.timestamp():.6f}")


@dataclass(frozen=True, kw_only=True)
class _Fired:
    request: TurnRequest
    position: int


def fire_due_schedules(
    *,
    engine: Engine,
    client: redis.Redis,
    grace: float,
    retention: int,
    hooks: ServiceHooks | None = None,
    now: datetime | None = None,
    limit: int = FIRE_LIMIT,
) -> int:
    """Fire the schedules due at `now` (None: the database's clock); returns how many turns it created.

    `grace` is CHATQ_SCHEDULE_MISFIRE_GRACE, `retention` the event retention (the queued event),
    `hooks` receive a `ScheduleFired` per schedule fired (the metrics counter).
    """
    fired: list[_Fired] = []
    events: list[ScheduleFired] = []
    with session_scope(engine) as db:
        moment = now if now is not None else db.execute(select(func.now())).scalar_one()
        due = (
            db.execute(
                select(Schedule)
                .where(Schedule.enabled, Schedule.next_run_at <= moment)
                .order_by(Schedule.next_run_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            .scalars()
            .all()
        )
        for row in due:
            made, skipped = _fire(db, row, moment, grace)
            fired.extend(made)
            events.append(ScheduleFired(schedule_id=row.id, runs=len(made), skipped=skipped))
    for turn in fired:
        _send(turn, client=client, retention=retention)
    for event in events:
        if hooks is not None:
            hooks.schedule_fired(event)
    if fired:
        log.info("fired %d scheduled turn(s) of %d schedule(s)", len(fired), len(events))
    return len(fired)


def _fire(db: Session, row: Schedule, now: datetime, grace: float) -> tuple[list[_Fired], int]:
    """One schedule's due ticks: their turns stored, the row advanced (the caller holds its lock)."""
    assert row.next_run_at is not None
    plan = plan_ticks(timing_of(row), next_run_at=row.next_run_at, now=now, misfire=Misfire(row.misfire), grace=grace)
    made: list[_Fired] = []
    skipped = plan.missed
    for tick in plan.run:
        if row.end_at is not None and tick > row.end_at:
            break
        if row.max_runs is not None and row.runs >= row.max_runs:
            break
        if Overlap(row.overlap) is Overlap.SKIP and _previous_unfinished(db, row.id):
            skipped += 1
            continue
        try:
            turn = _store_turn(db, row, tick)
        except SessionNotFound:  # its session is being deleted: the cascade takes the schedule too
            log.info("schedule %s: its session is gone", row.id)
            break
        if turn is not None:
            made.append(turn)
        row.runs += 1
        row.last_run_at = tick
    row.skipped += skipped
    row.next_run_at = plan.next_run_at
    done_runs = row.max_runs is not None and row.runs >= row.max_runs
    if done_runs or (row.end_at is not None and plan.next_run_at > row.end_at):
        row.enabled, row.next_run_at = False, None
        log.info("schedule %s: done after %d run(s)", row.id, row.runs)
    return made, skipped


def _previous_unfinished(db: Session, schedule_id: uuid.UUID) -> bool:
    return bool(db.execute(select(exists().where(Turn.schedule_id == schedule_id, turns.unfinished()))).scalar())


def _store_turn(db: Session, row: Schedule, tick: datetime) -> _Fired | None:
    """The tick's turn (and, from a template, its new session); None if it exists already."""
    turn_id = tick_turn_id(row.id, tick)
    session_id = row.session_id
    if session_id is None:
        template: dict[str, Any] = row.session_template or {}
        session_id = uuid.uuid5(_TICKS, f"session/{turn_id}")
        db.execute(
            insert(ChatSession)
            .values(
                id=session_id,
                agent_framework=template.get("framework", "langgraph"),
                model=template.get("model"),
                system_prompt=template.get("system_prompt"),
                metadata_=template.get("metadata") or {},
                tenant=row.tenant,
            )
            .on_conflict_do_nothing(index_elements=["id"])
        )
    request = TurnRequest(turn_id=turn_id, session_id=session_id, content=row.content)
    try:
        position = claims.insert_turn(db, request, queue=INTERACTIVE_QUEUE)
    except TurnExists:
        return None
    db.execute(update(Turn).where(Turn.id == turn_id).values(schedule_id=row.id))
    log.info("turn %s session %s: scheduled run of schedule %s (tick %s)", turn_id, session_id, row.id, tick)
    return _Fired(request=request, position=position)


def _send(turn: _Fired, *, client: redis.Redis, retention: int) -> None:
    request = turn.request
    try:
        TurnEvents(session_id=request.session_id, turn_id=request.turn_id, client=client, retention=retention).publish(
            EventType.QUEUED, 0, position=turn.position
        )
        send_turn(request.to_message(), queue=INTERACTIVE_QUEUE, client=client)
    except Exception as exc:  # stored as queued: the sweep sends it
        log.warning("turn %s: not sent (the sweep sends it): %s", request.turn_id, mask_secrets(str(exc))[:300])


def fire_schedules(runtime: Runtime) -> int:
    """The due step (`worker.runtime.recovery.due_steps`): `fire_due_schedules` on the runtime's
    connections and settings, every CHATQ_DUE_INTERVAL seconds in every worker."""
    return fire_due_schedules(
        engine=runtime.engine,
        client=runtime.redis,
        grace=runtime.settings.schedule_misfire_grace,
        retention=runtime.settings.event_retention,
        hooks=runtime.hooks,
    )

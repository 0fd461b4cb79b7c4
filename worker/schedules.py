"""Schedules: a turn submitted on a cron expression or every N seconds (docs/contract.md, "Schedules").

`create_schedule`, `list_schedules`, `get_schedule`, `update_schedule`, `pause_schedule`,
`resume_schedule`, `delete_schedule` and `schedule_runs` store and read the `schedules` table; the
workers fire them (`worker.runtime.recovery.schedule_firing`). Like sessions they are scoped by
tenant: another tenant's schedule is not found, exactly as one that does not exist. Every check
is made before anything is stored; an error is one line.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from chatq.settings import Settings
from handlers import framework_names
from models.db import session_scope
from models.tables import Schedule as ScheduleRow
from models.tables import Turn
from worker.errors import InvalidSchedule, InvalidTurn, ScheduleNotFound
from worker.history import scoped_session
from worker.payload import (
    check_text,
    parse_uuid,
    validate_content,
    validate_metadata,
    validate_model,
    validate_system_prompt,
    validate_tenant,
)
from worker.schedule_records import Schedule, ScheduleRun, schedule_of, timing_of
from worker.schedule_times import Misfire, Overlap, check_cron, check_zone
from worker.sessions import KEEP, Keep

__all__ = [
    "Schedule",
    "ScheduleRun",
    "create_schedule",
    "delete_schedule",
    "get_schedule",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "schedule_runs",
    "update_schedule",
]

log = logging.getLogger(__name__)

TEMPLATE_FIELDS = frozenset({"framework", "model", "system_prompt", "metadata"})
"""What a session template may hold: `create_session`'s arguments (its tenant is the schedule's)."""


def _aware(moment: datetime | str | None, name: str) -> datetime | None:
    if moment is None:
        return None
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidSchedule(f"{name} must be an ISO 8601 time such as 2026-12-01T10:00:00Z") from None
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise InvalidSchedule(f"{name} needs a time zone (an aware datetime, or Z or +hh:mm)")
    return moment


def _check_timing(cron: str | None, every: float | None, timezone: str) -> tuple[str | None, float | None, str]:
    if (cron is None) == (every is None):
        raise InvalidSchedule("give exactly one of cron (an expression) and every (seconds)")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int | float) or not every >= 1 or every > 366 * 86400:
            raise InvalidSchedule(f"every must be a number of seconds from 1 to a year, got {every!r}")
        every = float(every)
    return (check_cron(cron) if cron is not None else None), every, check_zone(timezone)


def _check_template(template: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    if not isinstance(template, Mapping):
        raise InvalidSchedule("session_template must be an object of create_session's fields")
    unknown = sorted(set(template) - TEMPLATE_FIELDS)
    if unknown:
        raise InvalidSchedule(f"unknown session_template field(s): {', '.join(map(str, unknown))[:200]}")
    framework = template.get("framework", "langgraph")
    if framework not in framework_names():
        raise InvalidSchedule(f"unknown agent framework {framework!r}; choose one of: {', '.join(framework_names())}")
    return {
        "framework": framework,
        "model": validate_model(template.get("model")),
        "system_prompt": validate_system_prompt(template.get("system_prompt"), settings),
        "metadata": validate_metadata(template.get("metadata")),
    }


def _policy(kind: type[Overlap] | type[Misfire], value: object, name: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise InvalidSchedule(f"unknown {name} {value!r}; choose one of: {', '.join(kind)}") from None


def _max_runs(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidSchedule(f"max_runs must be a whole number of at least 1, got {value!r}")
    return value


def _now(now: datetime | None) -> datetime:
    return now.astimezone(UTC) if now is not None else datetime.now(UTC)


def create_schedule(
    *,
    content: str,
    session_id: uuid.UUID | str | None = None,
    session_template: Mapping[str, Any] | None = None,
    cron: str | None = None,
    every: float | None = None,
    timezone: str = "UTC",
    overlap: Overlap | str = Overlap.SKIP,
    misfire: Misfire | str = Misfire.ONCE,
    start_at: datetime | str | None = None,
    end_at: datetime | str | None = None,
    max_runs: int | None = None,
    enabled: bool = True,
    name: str | None = None,
    tenant: str | None = None,
    now: datetime | None = None,
    settings: Settings,
) -> Schedule:
    """Store a schedule and return it; its first tick is the first after `now` (and `start_at`).

    Exactly one of `session_id` (each run a turn of that session, which `tenant` must own) and
    `session_template` (each run a new session: framework, model, system_prompt, metadata, owned
    by `tenant`, a name of `chatq.tenants`' rule); exactly one of `cron` (read in `timezone`) and
    `every` (seconds, at least 1).
    InvalidSchedule or SessionNotFound, one line, and nothing is stored. `settings` bound the
    content and the template's system prompt (the producer's `create_schedule` reads them).
    """
    if (session_id is None) == (session_template is None):
        raise InvalidSchedule("give exactly one of session_id and session_template")
    cron, every, timezone = _check_timing(cron, every, timezone)
    content = validate_content(content, settings)
    template = _check_template(session_template, settings) if session_template is not None else None
    if tenant is not None:
        try:
            # A template's sessions are stored with it: the same rule as every session's tenant.
            tenant = validate_tenant(tenant)
        except InvalidTurn as exc:
            raise InvalidSchedule(exc.message) from None
    overlap_policy: Overlap = _policy(Overlap, overlap, "overlap")
    misfire_policy: Misfire = _policy(Misfire, misfire, "misfire")
    start, end = _aware(start_at, "start_at"), _aware(end_at, "end_at")
    if name is not None:
        name = check_text(name, "name")[:200]
    moment = _now(now)
    with session_scope() as db:
        owner = tenant
        session_uuid = None
        if session_id is not None:
            session_uuid = parse_uuid(str(session_id), "session_id")
            owner = scoped_session(db, session_uuid, tenant).tenant
        row = ScheduleRow(
            id=uuid.uuid4(),
            name=name,
            tenant=owner,
            session_id=session_uuid,
            session_template=template,
            content=content,
            cron=cron,
            every_seconds=every,
            timezone=timezone,
            overlap=overlap_policy.value,
            misfire=misfire_policy.value,
            start_at=start,
            end_at=end,
            max_runs=_max_runs(max_runs),
            enabled=bool(enabled),
            created_at=moment,
        )
        row.next_run_at = _first_tick(row, moment)
        db.add(row)
        db.flush()
        log.info("schedule %s created (%s, next run %s)", row.id, cron or f"every {every:g}s", row.next_run_at)
        return schedule_of(row)


def _first_tick(row: ScheduleRow, now: datetime) -> datetime | None:
    """The first tick after `now` (every: the anchor itself when it is still ahead), None past `end_at`."""
    tick = timing_of(row).next_after(now)
    return tick if row.end_at is None or tick <= row.end_at else None


def _scoped(db: Session, schedule_id: uuid.UUID | str, tenant: str | None, *, lock: bool = False) -> ScheduleRow:
    schedule_uuid = parse_uuid(str(schedule_id), "schedule_id")
    query = select(ScheduleRow).where(ScheduleRow.id == schedule_uuid)
    if tenant is not None:
        query = query.where(ScheduleRow.tenant == tenant)
    if lock:
        query = query.with_for_update()
    row: ScheduleRow | None = db.execute(query).scalar_one_or_none()
    if row is None:
        raise ScheduleNotFound(f"schedule {schedule_uuid} does not exist")
    return row


def get_schedule(schedule_id: uuid.UUID | str, *, tenant: str | None = None) -> Schedule:
    """One schedule; ScheduleNotFound if it does not exist or belongs to another tenant."""
    with session_scope() as db:
        found: Schedule = schedule_of(_scoped(db, schedule_id, tenant))
    return found


def list_schedules(
    *, tenant: str | None = None, session_id: uuid.UUID | str | None = None, limit: int = 100
) -> list[Schedule]:
    """Schedules, newest first (a tenant's only, with `tenant`; one session's, with `session_id`)."""
    query = select(ScheduleRow).order_by(ScheduleRow.created_at.desc(), ScheduleRow.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(ScheduleRow.tenant == tenant)
    if session_id is not None:
        query = query.where(ScheduleRow.session_id == parse_uuid(str(session_id), "session_id"))
    with session_scope() as db:
        return [schedule_of(row) for row in db.execute(query).scalars()]


def schedule_runs(schedule_id: uuid.UUID | str, *, tenant: str | None = None, limit: int = 10) -> list[ScheduleRun]:
    """The schedule's latest runs, newest first, with their status."""
    with session_scope() as db:
        row = _scoped(db, schedule_id, tenant)
        turns = db.execute(
            select(Turn.id, Turn.session_id, Turn.status, Turn.created_at)
            .where(Turn.schedule_id == row.id)
            .order_by(Turn.created_at.desc(), Turn.id)
            .limit(limit)
        ).all()
    return [
        ScheduleRun(turn_id=t.id, session_id=t.session_id, status=str(t.status), created_at=t.created_at) for t in turns
    ]


def update_schedule(
    schedule_id: uuid.UUID | str,
    *,
    content: str | Keep = KEEP,
    cron: str | Keep | None = KEEP,
    every: float | Keep | None = KEEP,
    timezone: str | Keep = KEEP,
    overlap: Overlap | str | Keep = KEEP,
    misfire: Misfire | str | Keep = KEEP,
    end_at: datetime | str | Keep | None = KEEP,
    max_runs: int | Keep | None = KEEP,
    name: str | Keep | None = KEEP,
    tenant: str | None = None,
    now: datetime | None = None,
    settings: Settings,
) -> Schedule:
    """Change what is given; a new timing (cron, every, timezone) sets the next tick from `now`.

    Giving `cron` clears `every` and the reverse. The same checks as `create_schedule`.
    """
    moment = _now(now)
    with session_scope() as db:
        row = _scoped(db, schedule_id, tenant, lock=True)
        new_cron = row.cron if isinstance(cron, Keep) else cron
        new_every = (
            (float(row.every_seconds) if row.every_seconds is not None else None) if isinstance(every, Keep) else every
        )
        if not isinstance(cron, Keep) and cron is not None and isinstance(every, Keep):
            new_every = None
        if not isinstance(every, Keep) and every is not None and isinstance(cron, Keep):
            new_cron = None
        zone = row.timezone if isinstance(timezone, Keep) else timezone
        new_cron, new_every, zone = _check_timing(new_cron, new_every, zone)
        retimed = (new_cron, new_every, zone) != (row.cron, row.every_seconds, row.timezone)
        if not isinstance(content, Keep):
            row.content = validate_content(content, settings)
        if not isinstance(overlap, Keep):
            row.overlap = _policy(Overlap, overlap, "overlap").value
        if not isinstance(misfire, Keep):
            row.misfire = _policy(Misfire, misfire, "misfire").value
        if not isinstance(end_at, Keep):
            row.end_at = _aware(end_at, "end_at")
        if not isinstance(max_runs, Keep):
            row.max_runs = _max_runs(max_runs)
        if not isinstance(name, Keep):
            row.name = check_text(name, "name")[:200] if name is not None else None
        row.cron, row.every_seconds, row.timezone = new_cron, new_every, zone
        if retimed or not isinstance(end_at, Keep):
            if retimed and new_every is not None and row.start_at is None:
                row.start_at = moment  # a new period counts from now
            row.next_run_at = _first_tick(row, moment) if row.enabled or row.next_run_at is not None else None
        log.info("schedule %s updated", row.id)
        return schedule_of(row)


def pause_schedule(schedule_id: uuid.UUID | str, *, tenant: str | None = None) -> Schedule:
    """Stop firing it until `resume_schedule`; ticks while paused are not run later."""
    with session_scope() as db:
        row = _scoped(db, schedule_id, tenant, lock=True)
        row.enabled = False
        log.info("schedule %s paused", row.id)
        return schedule_of(row)


def resume_schedule(
    schedule_id: uuid.UUID | str, *, tenant: str | None = None, now: datetime | None = None
) -> Schedule:
    """Fire it again from its next tick after `now` (none of the ticks missed while paused)."""
    moment = _now(now)
    with session_scope() as db:
        row = _scoped(db, schedule_id, tenant, lock=True)
        if row.max_runs is not None and row.runs >= row.max_runs:
            raise InvalidSchedule(f"schedule {row.id} has made its {row.max_runs} runs; raise max_runs first")
        row.next_run_at = _first_tick(row, moment)
        row.enabled = row.next_run_at is not None
        if not row.enabled:
            raise InvalidSchedule(f"schedule {row.id} ended at {row.end_at}; move end_at first")
        log.info("schedule %s resumed (next run %s)", row.id, row.next_run_at)
        return schedule_of(row)


def delete_schedule(schedule_id: uuid.UUID | str, *, tenant: str | None = None) -> uuid.UUID:
    """Delete it; the turns it made stay (their `schedule_id` becomes NULL)."""
    with session_scope() as db:
        row = _scoped(db, schedule_id, tenant, lock=True)
        db.execute(delete(ScheduleRow).where(ScheduleRow.id == row.id))
        log.info("schedule %s deleted", row.id)
        return row.id

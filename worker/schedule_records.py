"""What the schedule API hands out: `Schedule` (a stored schedule) and `ScheduleRun` (one of its turns),
and how a row of `schedules` ticks (`timing_of`). docs/contract.md, "Schedules"."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from models.tables import Schedule as ScheduleRow
from worker.schedule_times import Misfire, Overlap, Timing

__all__ = ["Schedule", "ScheduleRun", "schedule_of", "timing_of"]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A stored schedule."""

    id: uuid.UUID
    """Its id."""
    name: str | None
    """A name for people; not unique."""
    tenant: str | None
    """The tenant that owns it; None: created without a tenant's token."""
    session_id: uuid.UUID | None
    """Each run is a turn of this session, in order behind its other turns; None with a template."""
    session_template: dict[str, Any] | None
    """Each run is a new session made from this (framework, model, system_prompt, metadata)."""
    content: str
    """The user message of each run."""
    cron: str | None
    """A five-field cron expression in `timezone`; None with `every`."""
    every: float | None
    """Seconds between ticks (from `start_at`, else from creation); None with `cron`."""
    timezone: str
    """The IANA zone `cron` is read in (default UTC)."""
    overlap: Overlap
    """A tick while the previous run is unfinished: skip it or run anyway."""
    misfire: Misfire
    """Ticks missed by more than CHATQ_SCHEDULE_MISFIRE_GRACE: none, one or each runs."""
    start_at: datetime | None
    """No tick before this."""
    end_at: datetime | None
    """No tick after this; the schedule is disabled once past it."""
    max_runs: int | None
    """The schedule is disabled after this many runs."""
    enabled: bool
    """False while paused, or once done (`end_at`, `max_runs`)."""
    next_run_at: datetime | None
    """Its next tick; None once done."""
    runs: int
    """Turns it created."""
    skipped: int
    """Ticks that made no turn (overlap skip, misfire)."""
    last_run_at: datetime | None
    """The tick of its latest run."""
    created_at: datetime
    """When it was created."""

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the HTTP API's and `chatq schedule show --json`'s)."""

        def when(moment: datetime | None) -> str | None:
            return moment.isoformat() if moment is not None else None

        return {
            "id": str(self.id),
            "name": self.name,
            "tenant": self.tenant,
            "session_id": str(self.session_id) if self.session_id else None,
            "session_template": self.session_template,
            "content": self.content,
            "cron": self.cron,
            "every": self.every,
            "timezone": self.timezone,
            "overlap": self.overlap.value,
            "misfire": self.misfire.value,
            "start_at": when(self.start_at),
            "end_at": when(self.end_at),
            "max_runs": self.max_runs,
            "enabled": self.enabled,
            "next_run_at": when(self.next_run_at),
            "runs": self.runs,
            "skipped": self.skipped,
            "last_run_at": when(self.last_run_at),
            "created_at": when(self.created_at),
        }


@dataclass(frozen=True, kw_only=True)
class ScheduleRun:
    """One turn a schedule created."""

    turn_id: uuid.UUID
    """The turn (its id is derived from the schedule and the tick)."""
    session_id: uuid.UUID
    """Its session."""
    status: str
    """The turn's status now."""
    created_at: datetime
    """When it was created (the firing)."""


def schedule_of(row: ScheduleRow) -> Schedule:
    """The row as a `Schedule`."""
    return Schedule(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        session_id=row.session_id,
        session_template=row.session_template,
        content=row.content,
        cron=row.cron,
        every=float(row.every_seconds) if row.every_seconds is not None else None,
        timezone=row.timezone,
        overlap=Overlap(row.overlap),
        misfire=Misfire(row.misfire),
        start_at=row.start_at,
        end_at=row.end_at,
        max_runs=row.max_runs,
        enabled=row.enabled,
        next_run_at=row.next_run_at,
        runs=row.runs,
        skipped=row.skipped,
        last_run_at=row.last_run_at,
        created_at=row.created_at,
    )


def timing_of(row: ScheduleRow) -> Timing:
    """The row's `Timing` (its anchor: start_at, else its creation)."""
    return Timing(
        cron=row.cron,
        every=float(row.every_seconds) if row.every_seconds is not None else None,
        timezone=row.timezone,
        anchor=row.start_at or row.created_at,
    )

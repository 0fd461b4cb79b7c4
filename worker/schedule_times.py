"""When a schedule ticks: its cron expression (in its zone) or its period, and which due ticks run.

Pure functions of a schedule's timing and a clock reading, so the firing
(`worker.runtime.recovery.schedule_firing`) and the API (`worker.schedules`) agree, and tests can
move the clock. Cron expressions are evaluated by cronsim in the schedule's zone (zoneinfo), which
follows Debian cron across daylight-saving changes: at spring-forward a tick that falls in the
skipped hour runs at the first instant after the jump (a daily 02:30 runs at 03:00 that day); at
fall-back a tick with a fixed hour runs once, at its first occurrence, while wildcard-hour ticks
(`*/15 * * * *`) run in both passes of the repeated hour. Ticks are instants (UTC in the database).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from worker.errors import InvalidSchedule

__all__ = [
    "MISFIRE_ALL_LIMIT",
    "Misfire",
    "Overlap",
    "TickPlan",
    "Timing",
    "check_cron",
    "check_zone",
    "plan_ticks",
]

MISFIRE_ALL_LIMIT = 100
"""The most missed ticks `misfire="all"` runs in one pass (the latest ones; older ones are skipped)."""

_SCAN_LIMIT = 10_000
"""Most cron ticks enumerated in one pass; a longer outage's older ticks are counted as skipped by one jump."""


class Overlap(enum.StrEnum):
    """What a tick does while the schedule's previous run is unfinished."""

    SKIP = "skip"
    """No run for this tick (counted in `skipped`)."""
    ENQUEUE = "enqueue"
    """Run anyway (in a session, it waits behind the unfinished one)."""


class Misfire(enum.StrEnum):
    """What ticks missed by more than the grace (workers down, Postgres down) become."""

    SKIP = "skip"
    """None runs; the schedule goes on from its next future tick."""
    ONCE = "once"
    """One run for all of them (the latest missed tick's), unless a tick on time runs in the same pass."""
    ALL = "all"
    """Each runs, up to MISFIRE_ALL_LIMIT (the latest ones)."""


@dataclass(frozen=True, kw_only=True)
class Timing:
    """How a schedule ticks."""

    cron: str | None
    """A five-field cron expression, evaluated in `timezone`; None with `every`."""
    every: float | None
    """Seconds between ticks, counted from `anchor`; None with `cron`."""
    timezone: str
    """An IANA zone name (zoneinfo), for `cron`."""
    anchor: datetime
    """The first tick of an `every` schedule (its start_at, else its creation); the earliest tick of a cron one."""

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment` (never before `anchor`)."""
        if moment < self.anchor:
            return self.anchor if self.every is not None else self._cron_after(self.anchor - timedelta(microseconds=1))
        if self.every is not None:
            periods = math.floor((moment - self.anchor).total_seconds() / self.every) + 1
            tick = self.anchor + timedelta(seconds=periods * self.every)
            return tick if tick > moment else tick + timedelta(seconds=self.every)
        return self._cron_after(moment)

    def _cron_after(self, moment: datetime) -> datetime:
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        # cronsim yields ticks strictly after its start, at minute resolution. UTC out: an ambiguous
        # local time (the repeated hour) never compares equal to another zone's (PEP 495).
        return next(iter(CronSim(self.cron, moment.astimezone(zone)))).astimezone(UTC)

    def due(self, first: datetime, now: datetime) -> tuple[int, list[datetime]]:
        """The ticks from `first` (a tick) up to `now`: how many, and the latest MISFIRE_ALL_LIMIT + 1 of them."""
        if first > now:
            return 0, []
        if self.every is not None:
            count = math.floor((now - first).total_seconds() / self.every) + 1
            start = max(count - MISFIRE_ALL_LIMIT - 1, 0)
            return count, [first + timedelta(seconds=i * self.every) for i in range(start, count)]
        latest: deque[datetime] = deque(maxlen=MISFIRE_ALL_LIMIT + 1)
        count, tick = 0, first
        while tick <= now:
            latest.append(tick)
            count += 1
            tick = self.next_after(tick)
            if count == _SCAN_LIMIT:  # a very long outage: jump to the last day, the count stays a floor
                tick = max(tick, self.next_after(now - timedelta(days=1)))
        return count, list(latest)


@dataclass(frozen=True, kw_only=True)
class TickPlan:
    """What one firing pass does with a schedule's due ticks."""

    run: list[datetime]
    """Ticks to make a turn for, oldest first."""
    missed: int
    """Due ticks that make no turn (misfire skip, or beyond MISFIRE_ALL_LIMIT, or folded into one run)."""
    next_run_at: datetime
    """The first tick after `now`."""


def plan_ticks(timing: Timing, *, next_run_at: datetime, now: datetime, misfire: Misfire, grace: float) -> TickPlan:
    """Which of the ticks due since `next_run_at` run now.

    A tick is on time while `now` is at most `grace` seconds past it: it runs. The others were
    missed (the firers were down or late) and `misfire` decides: none, one, or each.
    """
    count, ticks = timing.due(next_run_at, now)
    following = timing.next_after(now)
    cutoff = now - timedelta(seconds=grace)
    on_time = [tick for tick in ticks if tick >= cutoff]
    missed = [tick for tick in ticks if tick < cutoff]
    if misfire is Misfire.ALL:
        run = missed[-MISFIRE_ALL_LIMIT:] + on_time
    elif misfire is Misfire.ONCE and missed and not on_time:
        run = [missed[-1]]
    else:
        run = on_time
    if not count:
        return TickPlan(run=[], missed=0, next_run_at=following)
    return TickPlan(run=run, missed=count - len(run), next_run_at=following)


def check_zone(name: str) -> str:
    """`name` if it is an IANA zone zoneinfo knows; InvalidSchedule otherwise."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidSchedule(f"unknown time zone {str(name)[:64]!r}; use an IANA name such as Europe/Berlin or UTC")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f"unknown time zone {name!r}; use an IANA name such as Europe/Berlin or UTC") from None
    return name


def check_cron(expression: str) -> str:
    """`expression` if cronsim accepts it (five fields); InvalidSchedule otherwise."""
    if not isinstance(expression, str) or len(expression) > 200:
        raise InvalidSchedule("cron must be a five-field cron expression such as '*/5 * * * *'")
    try:
        CronSim(expression, datetime.now(ZoneInfo("UTC")))
    except CronSimError as exc:
        raise InvalidSchedule(f"bad cron expression {expression!r}: {exc}") from None
    return expression

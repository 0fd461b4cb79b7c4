"""Daylight-saving changes in Europe/Berlin, fired with an injected clock (docs/contract.md, "Schedules")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from tests.integration.schedules.conftest import fire
from worker.producer import create_schedule, get_schedule

BERLIN = ZoneInfo("Europe/Berlin")


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_spring_forward_a_daily_0230_runs_at_0300_that_day() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night.
    schedule = create_schedule(
        session_template={"framework": "none"},
        content="daily",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        now=datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN),
    )
    assert schedule.next_run_at == _utc(2026, 3, 29, 1, 0)  # 03:00 CEST, right after the jump
    assert fire(_utc(2026, 3, 29, 1, 0, 1)) == 1
    assert get_schedule(schedule.id).next_run_at == _utc(2026, 3, 30, 0, 30)  # 02:30 CEST again


def test_fall_back_a_daily_0230_runs_once() -> None:
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    schedule = create_schedule(
        session_template={"framework": "none"},
        content="daily",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        overlap="enqueue",
        now=datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN),
    )
    assert schedule.next_run_at == _utc(2026, 10, 25, 0, 30)  # the first 02:30 (CEST)
    assert fire(_utc(2026, 10, 25, 0, 30, 1)) == 1
    assert get_schedule(schedule.id).next_run_at == _utc(2026, 10, 26, 1, 30)  # not the second 02:30 (CET)
    assert fire(_utc(2026, 10, 25, 1, 30, 1)) == 0
    assert get_schedule(schedule.id).runs == 1


def test_fall_back_quarter_hours_tick_in_both_passes_of_the_repeated_hour() -> None:
    schedule = create_schedule(
        session_template={"framework": "none"},
        content="quarterly",
        cron="*/15 * * * *",
        timezone="Europe/Berlin",
        overlap="enqueue",
        now=datetime(2026, 10, 25, 1, 50, tzinfo=BERLIN),
    )
    moment, runs = _utc(2026, 10, 24, 23, 50), 0
    while moment <= _utc(2026, 10, 25, 1, 50):  # 01:50 CEST .. 02:50 CET, a minute at a time
        runs += fire(moment)
        moment += timedelta(minutes=1)
    # 02:00, 02:15, 02:30, 02:45 CEST, then again in CET, and 03:00 never reached (02:50 CET is the end).
    assert runs == 8
    assert get_schedule(schedule.id).runs == 8

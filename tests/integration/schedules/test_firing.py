"""Firing: every and cron ticks, misfire policies after downtime, overlap, bounds, pause/resume, races."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatSession, Schedule, Turn, TurnStatus
from tests.integration.schedules.conftest import fire
from worker.errors import ScheduleNotFound
from worker.producer import (
    create_schedule,
    create_session,
    delete_session,
    get_schedule,
    pause_schedule,
    resume_schedule,
    schedule_runs,
)
from worker.runtime.recovery.schedule_firing import tick_turn_id

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
TEMPLATE = {"framework": "none", "model": "echo"}


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _turns(schedule_id: uuid.UUID) -> list[Turn]:
    with session_scope() as db:
        rows = db.execute(select(Turn).where(Turn.schedule_id == schedule_id).order_by(Turn.created_at)).scalars()
        return list(rows)


def test_every_ticks_make_one_turn_each_in_a_new_session() -> None:
    schedule = create_schedule(session_template=TEMPLATE, content="ping", every=10, overlap="enqueue", now=T0)
    assert schedule.next_run_at == _at(10)
    assert fire(_at(9)) == 0
    assert fire(_at(10)) == 1
    assert fire(_at(10.5)) == 0, "a tick fires once"
    assert fire(_at(20.2)) == 1
    turns = _turns(schedule.id)
    assert [t.id for t in turns] == [tick_turn_id(schedule.id, _at(10)), tick_turn_id(schedule.id, _at(20))]
    assert len({t.session_id for t in turns}) == 2, "a template makes each run a new session"
    with session_scope() as db:
        session = db.get(ChatSession, turns[0].session_id)
        assert session is not None and session.agent_framework == "none" and session.model == "echo"
    after = get_schedule(schedule.id)
    assert (after.runs, after.last_run_at, after.next_run_at) == (2, _at(20), _at(30))
    assert [run.turn_id for run in schedule_runs(schedule.id)] == [t.id for t in reversed(turns)]
    assert {run.status for run in schedule_runs(schedule.id)} == {"queued"}


def test_cron_ticks_in_the_schedules_zone_run_in_order_in_its_session() -> None:
    session_id = create_session(framework="none", model="echo")
    start = datetime(2026, 12, 1, 9, 58, 30, tzinfo=UTC)  # 10:58:30 in Berlin
    schedule = create_schedule(
        session_id=session_id,
        content="hourly",
        cron="0 11 * * *",
        timezone="Europe/Berlin",
        overlap="enqueue",
        now=start,
    )
    assert schedule.next_run_at == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert fire(datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)) == 1
    assert get_schedule(schedule.id).next_run_at == datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert fire(datetime(2026, 12, 2, 10, 0, 2, tzinfo=UTC)) == 1
    turns = _turns(schedule.id)
    assert [t.session_id for t in turns] == [session_id, session_id]
    assert [t.position for t in turns] == [0, 1], "runs are turns of the session, in order"


@pytest.mark.parametrize(("misfire", "runs", "skipped"), [("skip", 0, 3), ("once", 1, 2), ("all", 3, 0)])
def test_misfire_after_thirty_seconds_down(misfire: str, runs: int, skipped: int) -> None:
    # Ticks at +10, +20, +30; the firers come back at +38: each tick is more than the grace (5 s) late.
    schedule = create_schedule(
        session_template=TEMPLATE, content="x", every=10, misfire=misfire, overlap="enqueue", now=T0
    )
    assert fire(_at(38)) == runs
    after = get_schedule(schedule.id)
    assert (after.runs, after.skipped, after.next_run_at) == (runs, skipped, _at(40))
    ids = [t.id for t in _turns(schedule.id)]
    expected = {"skip": [], "once": [_at(30)], "all": [_at(10), _at(20), _at(30)]}[misfire]
    assert sorted(ids) == sorted(tick_turn_id(schedule.id, tick) for tick in expected)
    assert fire(_at(40.5)) == 1, "after a misfire the schedule goes on as usual"


def test_a_tick_within_the_grace_runs_whatever_the_misfire_policy() -> None:
    schedule = create_schedule(session_template=TEMPLATE, content="x", every=10, misfire="skip", now=T0)
    assert fire(_at(14)) == 1
    assert get_schedule(schedule.id).skipped == 0


@pytest.mark.parametrize(("overlap", "runs"), [("skip", 1), ("enqueue", 2)])
def test_overlap_with_the_previous_run_unfinished(overlap: str, runs: int) -> None:
    schedule = create_schedule(session_template=TEMPLATE, content="x", every=10, overlap=overlap, now=T0)
    assert fire(_at(10)) == 1
    assert fire(_at(20)) == runs - 1  # the first run is still queued
    assert get_schedule(schedule.id).skipped == 2 - runs
    with session_scope() as db:  # once the previous run ended, the next tick runs under either policy
        for turn in db.execute(select(Turn).where(Turn.schedule_id == schedule.id)).scalars():
            turn.status = TurnStatus.SUCCEEDED
    assert fire(_at(30)) == 1


def test_max_runs_and_end_at_disable_the_schedule() -> None:
    capped = create_schedule(session_template=TEMPLATE, content="x", every=10, max_runs=2, overlap="enqueue", now=T0)
    ending = create_schedule(
        session_template=TEMPLATE, content="y", every=10, end_at=_at(25), overlap="enqueue", now=T0
    )
    for second in (10, 20, 30, 40):
        fire(_at(second))
    for schedule, runs in ((capped, 2), (ending, 2)):
        after = get_schedule(schedule.id)
        assert (after.runs, after.enabled, after.next_run_at) == (runs, False, None)
        assert len(_turns(schedule.id)) == runs


def test_pause_and_resume() -> None:
    schedule = create_schedule(session_template=TEMPLATE, content="x", every=10, overlap="enqueue", now=T0)
    assert pause_schedule(schedule.id).enabled is False
    assert fire(_at(10)) == 0 and fire(_at(30)) == 0
    resumed = resume_schedule(schedule.id, now=_at(35))
    assert (resumed.enabled, resumed.next_run_at) == (True, _at(40)), "ticks missed while paused do not run"
    assert fire(_at(40)) == 1


def test_deleting_the_session_deletes_its_schedules_and_keeps_template_schedules() -> None:
    session_id = create_session(framework="none", model="echo")
    on_session = create_schedule(session_id=session_id, content="x", every=10, now=T0)
    templated = create_schedule(session_template=TEMPLATE, content="x", every=10, now=T0)
    assert fire(_at(10)) == 2
    made = _turns(templated.id)[0].session_id
    delete_session(session_id)
    with pytest.raises(ScheduleNotFound):
        get_schedule(on_session.id)
    delete_session(made)  # a run's session deleted: the schedule goes on
    assert get_schedule(templated.id).runs == 1


def test_two_firers_racing_create_each_tick_once() -> None:
    schedules = [
        create_schedule(session_template=TEMPLATE, content=f"s{i}", every=10, overlap="enqueue", now=T0)
        for i in range(20)
    ]
    created: list[int] = []

    def firer(at: datetime, barrier: threading.Barrier) -> None:
        barrier.wait()
        created.append(fire(at))

    for second in (10, 20, 30):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=firer, args=(_at(second), barrier)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sum(created) == 60
    with session_scope() as db:
        ids = [s.id for s in schedules]
        per_schedule = dict(
            db.execute(
                select(Turn.schedule_id, func.count()).where(Turn.schedule_id.in_(ids)).group_by(Turn.schedule_id)
            ).all()
        )
        runs = dict(db.execute(select(Schedule.id, Schedule.runs).where(Schedule.id.in_(ids))).all())
    assert per_schedule == {sid: 3 for sid in ids}
    assert runs == {sid: 3 for sid in ids}

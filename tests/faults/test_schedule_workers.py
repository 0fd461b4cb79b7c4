"""Schedules fired by the workers themselves (no beat): two workers whose due timers run every 0.5 s fire an
`every=1` schedule for about 8 s while one of them is killed with SIGKILL midway. Each tick makes
one turn, whichever worker fires it: the count matches the ticks (give or take the tick at the
boundary), no tick twice.

Each worker fires due schedules on its due timer (worker/runtime/recovery/due_steps.py), every
0.5 s here; the sweep is off, so the due timer alone fires them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, select

from models.db import session_scope
from models.tables import Schedule, Turn
from tests.faults.helpers import STUB_MODEL, Workers
from worker.producer import create_schedule, pause_schedule
from worker.runtime.recovery.schedule_firing import tick_turn_id

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(worker_env: dict[str, str]) -> Iterator[Workers]:
    pool = Workers({**worker_env, "CHATQ_WORKER_SWEEP": "off", "CHATQ_DUE_INTERVAL": "0.5"})
    try:
        yield pool
    finally:
        pool.kill_all()
        print(pool.logs())  # shown only when the test failed


@pytest.mark.timeout(120)
def test_two_workers_fire_each_tick_once_while_one_is_killed(workers: Workers) -> None:
    workers.start(2)
    created = datetime.now(UTC)
    schedule = create_schedule(
        session_template={"framework": "none", "model": STUB_MODEL},
        content="tick",
        every=1,
        overlap="enqueue",
        misfire="all",
        now=created,
    )
    try:
        time.sleep(4)
        workers.started[0].kill()  # SIGKILL, perhaps while it holds the sweep lock or fires
        time.sleep(4)
        paused_at = datetime.now(UTC)
        pause_schedule(schedule.id)
        time.sleep(1)  # a firing pass that had the row before the pause commits first
        with session_scope() as db:
            turns = list(db.execute(select(Turn.id, Turn.session_id).where(Turn.schedule_id == schedule.id)).all())
    finally:
        with session_scope() as db:
            db.execute(delete(Schedule).where(Schedule.id == schedule.id))
    ticks = int((paused_at - created).total_seconds())  # ticks at created + 1 s, + 2 s, ... before the pause
    expected = {tick_turn_id(schedule.id, created + timedelta(seconds=k)): k for k in range(1, ticks + 2)}
    ids = [turn.id for turn in turns]
    assert len(ids) == len(set(ids)), "a tick made two turns"
    assert set(ids) <= set(expected), "a turn that is no tick's"
    assert ticks - 1 <= len(ids) <= ticks + 1, (len(ids), ticks)
    assert len({turn.session_id for turn in turns}) == len(ids), "each run is a new session"
    fired = sorted(expected[turn_id] for turn_id in ids)
    assert fired == list(range(1, len(ids) + 1)), f"a tick was left out: {fired}"

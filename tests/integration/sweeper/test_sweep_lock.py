"""The sweep lock against real Postgres: one holder at a time, released when the holder ends or dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import text

from models.db import unpooled_connection
from tests.support.inprocess import build_runtime
from tests.support.workers import ROOT
from worker.runtime.recovery.sweeper import SWEEP_LOCK_KEY, SweepReport, sweep_exclusively, sweep_lock

HOLD_LOCK = """
import sys, time
from worker.runtime.recovery.sweeper import sweep_lock
with sweep_lock(frozen_after=float(sys.argv[1]) if len(sys.argv) > 1 else None) as held:
    print("held" if held else "refused", flush=True)
    time.sleep(600)
"""


def _lock_holders() -> int:
    """Postgres sessions holding the sweep lock right now, as pg_locks tells."""
    with unpooled_connection() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                    " AND ((classid::bigint << 32) | objid::bigint) = :key"
                ),
                {"key": SWEEP_LOCK_KEY},
            )
        )


@contextmanager
def _lock_when_free(timeout: float = 30.0) -> Iterator[None]:
    """Hold the sweep lock, once no other holder has it: a worker another test left running on
    this database sweeps every second under the same lock."""
    deadline = time.monotonic() + timeout
    while True:
        with sweep_lock() as held:
            if held:
                yield
                return
        assert time.monotonic() < deadline, "the sweep lock never came free"
        time.sleep(0.02)


def test_a_second_try_fails_while_the_first_holds_the_lock_and_succeeds_after(chatq_env: dict[str, str]) -> None:
    with _lock_when_free():
        assert _lock_holders() == 1
        with sweep_lock() as second:  # another connection, as another worker would have
            assert not second
        assert _lock_holders() == 1
    with _lock_when_free():  # released: it can be taken again
        assert _lock_holders() == 1


def test_no_sweep_runs_while_another_holds_the_lock(chatq_env: dict[str, str]) -> None:
    with _lock_when_free():
        assert sweep_exclusively(build_runtime()) is None
    deadline = time.monotonic() + 30
    report = sweep_exclusively(build_runtime())
    while report is None and time.monotonic() < deadline:
        time.sleep(0.02)
        report = sweep_exclusively(build_runtime())
    assert isinstance(report, SweepReport)


@pytest.mark.timeout(60)
def test_postgres_releases_the_lock_of_a_holder_killed_with_sigkill(chatq_env: dict[str, str]) -> None:
    """No expiry to wait out: the lock goes with the dead holder's connection."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK],
        cwd=ROOT,
        env={**os.environ, **chatq_env},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with sweep_lock() as while_alive:
            assert not while_alive
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
    deadline = time.monotonic() + 30
    while True:
        with sweep_lock() as after_death:
            if after_death:
                break
        assert time.monotonic() < deadline, "the killed holder's lock was never released"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_postgres_releases_the_lock_of_a_frozen_holder_after_frozen_after(chatq_env: dict[str, str]) -> None:
    """A holder stopped with SIGSTOP keeps its connection open: without the idle limit every sweep
    would be skipped until it runs again (and turns whose leases ran out never taken over)."""
    frozen_after = 1.0
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(frozen_after)],
        cwd=ROOT,
        env={**os.environ, **chatq_env},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        os.killpg(holder.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        with sweep_lock() as while_fresh:
            assert not while_fresh
        deadline = time.monotonic() + 30
        while True:
            with sweep_lock() as after_idle:
                if after_idle:
                    break
            assert time.monotonic() < deadline, "the frozen holder's lock was never released"
            time.sleep(0.05)
        assert time.monotonic() - frozen_at >= frozen_after * 0.9
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)

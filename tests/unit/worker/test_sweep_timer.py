"""The sweep timer's thread: rounds go on through failures, which are logged once per outage."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from worker.runtime.recovery.sweep_timer import SweepTimer
from worker.runtime.recovery.sweeper import SweepReport


class FlakySweep:
    """A sweep that fails its first `failures` rounds (Postgres down, say), then works."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.rounds = 0
        self.threads: set[str] = set()
        self.done = threading.Event()

    def __call__(self) -> SweepReport:
        self.rounds += 1
        self.threads.add(threading.current_thread().name)
        if self.rounds <= self.failures:
            raise ConnectionError(f"cannot reach postgresql+psycopg://chatq:hunter2@db/chatq (round {self.rounds})")
        if self.rounds >= self.failures + 2:
            self.done.set()
        return SweepReport(resent=0, expired_leases=0)


def test_failing_rounds_are_logged_once_and_the_timer_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    sweep = FlakySweep(failures=3)
    timer = SweepTimer(interval=0.01, sweep=sweep)
    with caplog.at_level(logging.DEBUG, logger="worker.runtime.recovery.sweep_timer"):
        timer.start()
        try:
            assert sweep.done.wait(10), f"only {sweep.rounds} round(s) ran"
        finally:
            timer.stop()
            assert timer.join(5)
    assert sweep.threads == {"chatq-sweep-timer"}
    records = [r for r in caplog.records if r.name == "worker.runtime.recovery.sweep_timer"]
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sweep failed" in warnings[0]
    assert "hunter2" not in " ".join(r.getMessage() for r in records)
    assert [r.getMessage() for r in records if r.levelno == logging.INFO] == ["sweep works again"]


def test_stop_ends_the_thread_without_waiting_for_the_interval() -> None:
    sweep = FlakySweep(failures=0)
    timer = SweepTimer(interval=3600, sweep=sweep)
    timer.start()
    deadline = time.monotonic() + 10
    while sweep.rounds == 0:  # the first round runs at once
        assert time.monotonic() < deadline
        time.sleep(0.01)
    timer.stop()
    assert timer.join(5)
    assert sweep.rounds == 1

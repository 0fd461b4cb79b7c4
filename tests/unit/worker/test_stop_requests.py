"""Stop signals only record the request (worker/ops/stopping.py); a thread acts on them.

Issue 34: a Ctrl-C reaches a supervised child twice, and the second of Celery's handlers ran inside
the first, waiting forever on the lock of `worker_shutting_down`'s dispatch. The first test makes
that nesting certain: it holds the dispatch lock while two stop signals arrive.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

from tests.support.workers import ROOT
from worker.ops.stopping import StopRequests

PROBE = textwrap.dedent(
    """
    import signal, sys, time
    from celery.signals import worker_shutting_down
    from worker.app import app

    class Node:
        hostname = "probe@host"

    announced = []
    worker_shutting_down.connect(lambda sig=None, how=None, **_: announced.append((sig, how)), weak=False)
    tweaks = app.Worker.__new__(app.Worker)  # the worker application the `worker` command builds
    tweaks._isatty = True
    tweaks.install_platform_tweaks(Node())
    with worker_shutting_down.lock:  # as if a signal came while a first handler dispatched
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    print("handlers returned", flush=True)
    deadline = time.monotonic() + 10
    while not announced and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    print("announced", announced, flush=True)
    """
)


def test_stop_signals_arriving_during_a_dispatch_neither_wait_for_it_nor_stop_twice() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"a stop signal handler waited on the dispatch lock (deadlock): {exc.stdout!r}") from None
    assert "handlers returned" in done.stdout, done.stdout + done.stderr
    # One warm shutdown, announced once from the stop thread once the lock was free.
    assert "announced [('SIGINT', 'Warm')]" in done.stdout, done.stdout + done.stderr


class Recorder(StopRequests):
    """The stop decisions, without stopping anything."""

    def __init__(self) -> None:
        super().__init__(grace=3.0)
        self.done: list[tuple[str, int]] = []
        self.warmed = threading.Event()

    def warm(self, worker: Any, signum: int) -> None:
        self.done.append(("warm", signum))
        self.warmed.set()

    def cold(self, worker: Any, signum: int) -> None:
        self.done.append(("cold", signum))


def test_requests_within_the_grace_are_one_warm_shutdown_and_a_later_one_is_cold(monkeypatch: Any) -> None:
    clock = [100.0]
    monkeypatch.setattr("worker.ops.stopping.time.monotonic", lambda: clock[0])
    requests = Recorder()
    assert requests.handle(None, signal.SIGINT)
    assert requests.warmed.wait(5)
    clock[0] += 1.0
    assert requests.handle(None, signal.SIGTERM)
    assert requests.handle(None, signal.SIGINT)
    assert requests.done == [("warm", signal.SIGINT)]
    clock[0] += 2.5  # 3.5 s after the first
    assert not requests.handle(None, signal.SIGTERM)
    assert requests.done == [("warm", signal.SIGINT), ("cold", signal.SIGTERM)]


def test_sigquit_is_a_cold_stop_at_once() -> None:
    requests = Recorder()
    assert not requests.handle(None, signal.SIGQUIT)
    assert requests.done == [("cold", signal.SIGQUIT)]


def test_the_handler_only_records() -> None:
    requests = Recorder()
    requests.record(signal.SIGTERM, None)
    requests.record(signal.SIGINT, None)
    assert requests.done == []  # nothing acted on inside the handler
    assert requests._requests.qsize() == 2

"""Stopping a worker: the signal handlers only record the request, an ordinary thread stops it.

Celery's own SIGINT/SIGTERM/SIGQUIT handlers do their work inside the handler: they dispatch
`worker_shutting_down` (which takes a lock) and write to the terminal. A Ctrl-C reaches a
supervised child twice (from the terminal's process group and again from the supervisor), and
Python runs a second handler *inside* the first one, between two of its bytecodes: the second
waited forever on the lock the first held, and the worker hung with its turns still running.

chatq's `Worker` (the app's `app.Worker`, worker/app.py) therefore replaces those three handlers
right after Celery installs them with `StopRequests.record`, which only puts the signal number on a
`queue.SimpleQueue` (its `put` is documented reentrant: safe to interrupt by another `put`). The
`chatq-stop` thread takes the requests off the queue:

- the first SIGINT or SIGTERM starts one warm shutdown (on a thread of its own, so the next
  request is heard whatever a receiver does): `worker_shutting_down` is dispatched
  (running turns are handed back, worker/ops/signals.py; the sweep timer stops), then Celery's
  consumer loop is asked to stop (`state.should_stop`), and the worker exits 0;
- further SIGINT/SIGTERM within `ESCALATION_GRACE` seconds of the first are the same request
  (the terminal's and the supervisor's copy of one Ctrl-C) and change nothing;
- one after that, or any SIGQUIT, is a cold stop: the process exits with status 1 at once, and
  the turns still running are taken over by another worker when their lease runs out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from queue import SimpleQueue
from types import FrameType
from typing import Any

from celery.apps.worker import Worker as CeleryWorker
from celery.platforms import EX_FAILURE, EX_OK
from celery.signals import worker_shutting_down
from celery.worker import state

log = logging.getLogger(__name__)

ESCALATION_GRACE = 3.0
"""Seconds after the first stop request during which further SIGINT/SIGTERM are the same request."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


class StopRequests:
    """The stop requests of one worker process and the thread that acts on them."""

    def __init__(self, *, grace: float = ESCALATION_GRACE) -> None:
        self.grace = grace
        self._requests: SimpleQueue[int] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self.warm_at: float | None = None
        """time.monotonic() of the warm shutdown, once it began."""

    def record(self, signum: int, _frame: FrameType | None = None) -> None:
        """The signal handler: records the request, nothing else (no lock, no I/O)."""
        self._requests.put_nowait(signum)

    def install(self, worker: Any) -> None:
        """Handle SIGINT, SIGTERM and SIGQUIT with `record` (main thread only) and start the thread."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.record)
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, args=(worker,), name="chatq-stop", daemon=True)
            self._thread.start()

    def _serve(self, worker: Any) -> None:
        while True:
            signum = self._requests.get()
            try:
                if not self.handle(worker, signum):
                    return
            except Exception:  # never lose the next request over a failing receiver
                log.exception("stop request %s failed", _name(signum))

    def handle(self, worker: Any, signum: int) -> bool:
        """Act on one request; False once the process is being ended."""
        now = time.monotonic()
        if signum != signal.SIGQUIT:
            if self.warm_at is None:
                self.warm_at = now
                # On a thread of its own: a receiver that blocks must not keep a cold stop from being heard.
                threading.Thread(target=self.warm, args=(worker, signum), name="chatq-warm-stop", daemon=True).start()
                return True
            if now - self.warm_at < self.grace:
                log.info("%s: the warm shutdown is already under way", _name(signum))
                return True
        self.cold(worker, signum)
        return False

    def warm(self, worker: Any, signum: int) -> None:
        """Hand running turns back and stop the sweep timer (the receivers), then stop the consumer."""
        log.warning(
            "worker: Warm shutdown (%s): handing running turns back; a stop request %gs or more later exits at once",
            _name(signum),
            self.grace,
        )
        worker_shutting_down.send(sender=_hostname(worker), sig=_name(signum), how="Warm", exitcode=EX_OK)
        # Celery's consumer loop checks this flag (as its own handler sets it), and stops taking messages.
        setattr(state, "should_stop", EX_OK)  # noqa: B010 (typed as None in celery-types)

    def cold(self, worker: Any, signum: int) -> None:
        """End the process now; leases return its running turns to the queue."""
        log.warning(
            "worker: Cold shutdown (%s): exiting now; turns still running move on when their lease runs out",
            _name(signum),
        )
        if self.warm_at is None:
            worker_shutting_down.send(sender=_hostname(worker), sig=_name(signum), how="Cold", exitcode=EX_FAILURE)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        os._exit(EX_FAILURE)


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def _hostname(worker: Any) -> str:
    return str(getattr(worker, "hostname", "") or "")


_requests: list[StopRequests] = []


def stop_requests() -> StopRequests:
    """This process's stop requests (built on first use)."""
    if not _requests:
        _requests.append(StopRequests())
    return _requests[0]


class Worker(CeleryWorker):
    """Celery's worker application with chatq's stop handling (`app.Worker`, worker/app.py)."""

    def install_platform_tweaks(self, worker: Any) -> None:
        """Celery's tweaks, then chatq's stop handlers in place of Celery's three."""
        super().install_platform_tweaks(worker)
        stop_requests().install(worker)

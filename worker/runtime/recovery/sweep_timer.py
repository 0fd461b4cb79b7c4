"""Every worker sweeps on its own timer, so recovery needs no `chatq beat`.

A daemon thread, started when the worker is ready and stopped at shutdown, runs
`sweep_exclusively` every CHATQ_SWEEP_INTERVAL seconds (the first round at once, so turns lost
while no worker ran are found as soon as one starts). The Postgres sweep lock lets one sweep run
at a time across all workers and beat; the others skip that round. A failing round (Postgres or
Redis down) is logged and the next one tries again: the timer never stops the consumer or the
worker.

The app loads this module with its tasks (`include` in worker/app.py), not from worker/ops/signals.py:
the sweep sends through the app, and worker.app imports worker.ops.signals, so connecting the
handlers there would make an import cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from chatq.masking import mask_secrets
from worker.runtime.delivery.process import Runtime, current_runtime
from worker.runtime.recovery.periodic import PeriodicThread
from worker.runtime.recovery.sweeper import SweepReport, sweep_exclusively

log = logging.getLogger(__name__)


class SweepTimer(PeriodicThread):
    """Runs `sweep` every `interval` seconds on a daemon thread until `stop`."""

    def __init__(self, *, interval: float, sweep: Callable[[], SweepReport | None]) -> None:
        super().__init__(interval=interval, name="chatq-sweep-timer")
        self._sweep = sweep
        self._failing = False

    def run_round(self) -> None:
        """One round; any error is logged (once per outage at WARNING), never raised."""
        try:
            self._sweep()
        except Exception as exc:
            # An outage fails every round until it ends: say so once, not every interval.
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "sweep failed (next try in %gs): %s", self.interval, mask_secrets(str(exc)))
            self._failing = True
            return
        if self._failing:
            log.info("sweep works again")
            self._failing = False


_timer: list[SweepTimer] = []
"""This process's timer, once the worker is ready."""


def start_worker_sweeps(runtime: Runtime) -> SweepTimer | None:
    """Start this worker's sweep timer unless CHATQ_WORKER_SWEEP is off (the runtime's settings)."""
    settings = runtime.settings
    if not settings.worker_sweep:
        log.info("in-worker sweeps are off (CHATQ_WORKER_SWEEP): run `chatq beat` for recovery")
        return None
    if _timer:
        return _timer[0]
    timer = SweepTimer(interval=settings.sweep_interval, sweep=lambda: sweep_exclusively(runtime))
    _timer.append(timer)
    timer.start()
    log.info("sweeping every %gs (one worker at a time, under a Postgres advisory lock)", timer.interval)
    return timer


def stop_worker_sweeps(*, wait: bool) -> None:
    """Stop the timer; with `wait`, give a sweep in progress STOP_TIMEOUT seconds to end."""
    for timer in _timer:
        timer.stop()
        if wait and not timer.join():
            log.warning("a sweep was still running at shutdown; leaving it to end with the process")


@worker_ready.connect
def _start_sweeping(**_: Any) -> None:
    try:
        start_worker_sweeps(current_runtime())
    except Exception as exc:  # the worker still runs turns; only its own sweeps are missing
        log.warning("could not start the sweep timer: %s", mask_secrets(str(exc)))


@worker_shutting_down.connect
def _stop_sweeping(**_: Any) -> None:
    # Dispatched on the chatq-stop thread (worker/ops/stopping.py): ask the timer to stop and return,
    # so the hand-back is not kept waiting; worker_shutdown waits for a sweep in progress.
    stop_worker_sweeps(wait=False)


@worker_shutdown.connect
def _wait_for_the_sweep(**_: Any) -> None:
    stop_worker_sweeps(wait=True)

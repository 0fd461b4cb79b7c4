"""Every worker fires what is due on its own timer, so delayed turns need no `chatq beat`.

A daemon thread, started when the worker is ready and stopped at shutdown, runs the due steps
(`worker.runtime.recovery.due_steps.DUE_STEPS`, in order) every CHATQ_DUE_INTERVAL seconds, the
first round at once. Every worker runs them; each step takes its due rows with SKIP LOCKED, so
each item fires once however many workers there are. A failing step (Postgres or Redis down) is
logged, once per outage, and tried again next round; the other steps still run, and the timer
never stops the consumer or the worker. It connects to Celery's signals only; the process's
signal handlers are left as they are.

The app loads this module with its tasks (`include` in worker/app.py), as it does the sweep timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from chatq.masking import mask_secrets
from worker.runtime.delivery.process import Runtime, current_runtime
from worker.runtime.policy import threads
from worker.runtime.recovery.due_steps import DUE_STEPS, DueStep
from worker.runtime.recovery.periodic import PeriodicThread

log = logging.getLogger(__name__)


class DueTimer(PeriodicThread):
    """Runs `steps` on `runtime` every `interval` seconds on a daemon thread until `stop`."""

    def __init__(self, *, interval: float, runtime: Runtime, steps: Sequence[DueStep] = DUE_STEPS) -> None:
        super().__init__(interval=interval, name="chatq-due-timer")
        self._runtime = runtime
        self._steps = tuple(steps)
        self._failing: set[str] = set()

    def run_round(self) -> int:
        """Each step once; returns what they fired. Errors are logged (once per outage at WARNING), never raised."""
        fired = 0
        for step in self._steps:
            fired += self._run_step(step)
        return fired

    def _run_step(self, step: Callable[[Runtime], int]) -> int:
        name = getattr(step, "__name__", repr(step))
        try:
            fired = step(self._runtime)
        except Exception as exc:
            # An outage fails every round until it ends: say so once, not every interval.
            level = logging.DEBUG if name in self._failing else logging.WARNING
            log.log(level, "due step %s failed (next try in %gs): %s", name, self.interval, mask_secrets(str(exc)))
            self._failing.add(name)
            return 0
        if name in self._failing:
            log.info("due step %s works again", name)
            self._failing.discard(name)
        return fired


_timer: list[DueTimer] = []
"""This process's timer, once the worker is ready."""


def start_due_timer(runtime: Runtime) -> DueTimer:
    """Start this worker's due timer (once per process), every CHATQ_DUE_INTERVAL seconds (the runtime's settings)."""
    if _timer:
        return _timer[0]
    timer = DueTimer(interval=runtime.settings.due_interval, runtime=runtime)
    _timer.append(timer)
    timer.start()
    log.info("firing due work every %gs (%d step(s))", timer.interval, len(DUE_STEPS))
    return timer


def stop_due_timer(*, wait: bool) -> None:
    """Stop the timer; with `wait`, give a round in progress STOP_TIMEOUT seconds to end."""
    for timer in _timer:
        timer.stop()
        if wait and not timer.join():
            log.warning("a due round was still running at shutdown; leaving it to end with the process")


@worker_ready.connect
def _start_firing(sender: Any = None, **_: Any) -> None:
    try:
        runtime = current_runtime()
        # This process's threads count in the fleet's from the timer's first round (its first step).
        controller = getattr(sender, "controller", None)
        pool = getattr(controller, "concurrency", None) or runtime.settings.worker_concurrency
        threads.join_fleet(str(getattr(sender, "hostname", None) or "worker"), int(pool))
        start_due_timer(runtime)
    except Exception as exc:  # the worker still runs turns; only its own due rounds are missing
        log.warning("could not start the due timer: %s", mask_secrets(str(exc)))


@worker_shutting_down.connect
def _stop_firing(**_: Any) -> None:
    # Dispatched on the chatq-stop thread (worker/ops/stopping.py): ask and return at once.
    stop_due_timer(wait=False)
    try:
        threads.leave_fleet(current_runtime().redis)  # the others stop counting this worker's threads now
    except Exception as exc:  # its entry expires by itself
        log.debug("could not leave the fleet's threads: %s", exc)


@worker_shutdown.connect
def _wait_for_the_round(**_: Any) -> None:
    stop_due_timer(wait=True)

"""The due steps: what every worker's `DueTimer` runs every CHATQ_DUE_INTERVAL seconds, in order.

The one registration point. A step is a function `step(runtime) -> int` (the `Runtime` of the
worker process; it returns how many things it fired, for the log). Each must be cheap when nothing
is due (one indexed query), safe to run in every worker at once (each item fired once: take due
rows with `FOR UPDATE SKIP LOCKED`), and send its task messages only after its commit, leaving
lost ones to the sweep. A step that raises is logged and tried again next round; the other steps
still run. To add one, import it here and append it to `DUE_STEPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.runtime.policy.threads import refresh_fleet_threads
from worker.runtime.recovery.due_turns import release_due_turns
from worker.runtime.recovery.schedule_firing import fire_schedules

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

DueStep = Callable[["Runtime"], int]
"""A due step: fires what is due on the runtime's connections; returns how many it fired."""

DUE_STEPS: tuple[DueStep, ...] = (
    refresh_fleet_threads,  # this worker's threads in the fleet's count (the threads' fair share)
    release_due_turns,  # delayed turns (`submit_turn(run_at=..., delay=...)`)
    fire_schedules,  # schedules' ticks (`create_schedule`)
)
"""The steps every worker runs each round, in this order."""

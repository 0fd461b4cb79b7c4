"""A worker plugin (`CHATQ_PLUGINS=bench.journal_off`) that switches the journal of durable steps off.

The baseline of bench/durability.py: a worker that neither reads a turn's journal when an attempt
starts nor records its steps, so every attempt starts over, as chatq did before durable steps (and
as a handler written only to the public contract still does). Only for measuring: the same worker
code, the journal handed to no one. A plugin because `chatq worker` replaces itself with Celery
(exec): the worker's own process imports its plugins again, and this switch with them.
"""

from __future__ import annotations

import os
from typing import Any


def apply() -> None:
    """Switch the journal off in this process (before the worker starts)."""
    from handlers import turn_input
    from worker.runtime.delivery import runner
    from worker.store.journal import TurnJournal

    build = turn_input.build_turn_input

    def build_without_journal(*args: Any, **kwargs: Any) -> Any:
        kwargs["journal"] = None
        return build(*args, **kwargs)

    def empty_journal(claim: Any, runtime: Any) -> TurnJournal:
        # Nothing read: the runner's `retry` events then say the attempt starts over.
        return TurnJournal(
            runtime.engine, turn_id=claim.turn_id, lease_token=claim.lease_token, attempt=claim.attempt, done=()
        )

    # Both are looked up at call time (worker.runtime.delivery.relay imports build_turn_input per turn).
    turn_input.build_turn_input = build_without_journal  # type: ignore[assignment]
    runner.open_journal = empty_journal  # type: ignore[assignment]


# Only in a worker started with this plugin: importing the module for its name changes nothing.
if __name__ in os.environ.get("CHATQ_PLUGINS", "").split(","):
    apply()

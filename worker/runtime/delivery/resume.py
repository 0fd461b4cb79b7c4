"""Where a claimed turn resumes: its journal opened when the attempt starts (`worker.store.journal`),
and what the `retry` event ending an attempt says of it (`resumed_after`, docs/contract.md "Durable steps")."""

from __future__ import annotations

import contextlib

from worker.runtime.delivery.process import Runtime
from worker.store import claims
from worker.store.journal import TurnJournal

__all__ = ["announced", "open_journal", "resuming"]


def open_journal(claim: claims.Claim, runtime: Runtime) -> TurnJournal:
    """The claimed turn's journal (`worker.store.journal`), with the steps earlier attempts finished.

    Postgres unreachable: the turn goes back to the queue if the database lets us (else its lease
    runs out), and the outage propagates for the task to retry the delivery. A claim that saw no
    steps (the usual first attempt) opens an empty journal without reading it.
    """
    if not claim.has_steps:
        return TurnJournal(
            runtime.engine, turn_id=claim.turn_id, lease_token=claim.lease_token, attempt=claim.attempt, done=()
        )
    try:
        return TurnJournal.open(
            runtime.engine, turn_id=claim.turn_id, lease_token=claim.lease_token, attempt=claim.attempt
        )
    except Exception:
        with contextlib.suppress(Exception):
            claims.requeue_turn(claim, engine=runtime.engine, hand_back=True)
        raise


def resuming(why: str, journal: TurnJournal) -> dict[str, object]:
    """The fields of a `retry` event: why, and where the next attempt continues (`resumed_after`,
    only when there are finished steps to continue after)."""
    steps = journal.finished_steps
    if not steps:
        return {"error": f"{why}; starting over"}
    return {"error": f"{why}; resuming after step {steps}", "resumed_after": steps}


def announced(error: str, resumed_after: int) -> dict[str, object]:
    """A `retry` event's fields: the error, and `resumed_after` when the next attempt continues after finished steps."""
    return {"error": error, "resumed_after": resumed_after} if resumed_after else {"error": error}

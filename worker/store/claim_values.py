"""What the transitions of `worker.store.claims` return: a claim and the outcomes of claiming and ending.

Value objects only, apart from the transitions so that `claims.py` holds statements and rules alone;
`worker.store.claims` re-exports them (`claims.Claim`, `claims.ClaimStatus`, ...). They are the
store's own: the runner makes the handler's `SessionInfo` of a claim's `ClaimedSession`.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models.history import HistoryRow
from worker.payload import task_message
from worker.store.turns import NextTurn

__all__ = ["Claim", "ClaimResult", "ClaimStatus", "ClaimedSession", "Finished", "WhyNotClaimed", "history_head_of"]


class ClaimStatus(enum.StrEnum):
    """What a claim attempt found."""

    CLAIMED = "claimed"
    NOT_FOUND = "not_found"
    FINISHED = "finished"
    BUSY = "busy"
    BLOCKED = "blocked"
    POISONED = "poisoned"
    CANCELLED = "cancelled"
    CONFLICT = "conflict"
    PAUSED = "paused"
    """It waits for a person's decision on its tool calls; the decision sends it again."""


class WhyNotClaimed(enum.StrEnum):
    """Why the claim statement took nothing, as `worker.store.transition_sql.WHY_NOT_CLAIMED` says."""

    CONFLICT = "conflict"
    FINISHED = "finished"
    BUSY = "busy"
    BLOCKED = "blocked"
    PAUSED = "paused"
    STOPPED = "stopped"
    CANCEL_PENDING = "cancel_pending"
    POISON = "poison"
    RUNNABLE = "runnable"


@dataclass(frozen=True, kw_only=True)
class ClaimedSession:
    """The session of a claimed turn, as the claim read it."""

    id: uuid.UUID
    """The session id."""
    agent_framework: str
    """Its agent framework."""
    model: str | None
    """Its model; None: the worker's default."""
    system_prompt: str | None
    """Its own instructions."""
    metadata: Mapping[str, Any]
    """Its free-form metadata."""
    knowledge_bases: tuple[str, ...]
    """Names of its tenant's knowledge bases attached to it, sorted."""
    tenant: str | None = None
    """The tenant that owns the session (None: no tenant); its turns share capacity and budget as it."""


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A turn this worker now runs, with everything the run needs."""

    turn_id: uuid.UUID
    """The turn (= task id)."""
    session: ClaimedSession
    """The session, detached from the database."""
    position: int
    """The turn's position in its session."""
    attempt: int
    """The handler invocation this claim starts (1 for the first)."""
    deliveries: int
    """How many times the turn has been claimed, this one included."""
    lease_token: uuid.UUID
    """Proof of ownership; finishing writes require it."""
    content: str
    """The user's message."""
    images: tuple[str, ...] | None
    """Images attached to the user's message."""
    reply_to: int | None
    """The user message being answered, for regenerate/edit."""
    queue: str
    """The queue the turn travels on."""
    has_webhook: bool = False
    """Whether the turn (or its session) has a webhook to POST it to when it ends."""
    history_head: tuple[HistoryRow, ...] | None = None
    """The session's newest history rows (at most `transition_sql.HISTORY_HEAD`, newest first), as
    the claim read them; None when it read none (a reply_to turn)."""
    has_steps: bool = True
    """Whether earlier attempts left steps in the turn's journal, as the claim saw it (False: the
    attempt starts with an empty journal without reading it)."""

    def to_message(self) -> dict[str, Any]:
        """The turn's `chatq.run_turn` message, to send it again."""
        return task_message(
            turn_id=self.turn_id,
            session_id=self.session.id,
            content=self.content,
            images=self.images,
            reply_to=self.reply_to,
        )


@dataclass(frozen=True, kw_only=True)
class ClaimResult:
    """The outcome of `claim_turn`."""

    status: ClaimStatus
    """What the claim found."""
    claim: Claim | None = None
    """Set when `status` is CLAIMED."""
    retry_after: float | None = None
    """For BUSY: seconds until the current lease runs out."""
    error: str | None = None
    """For POISONED: the error stored on the turn; for CONFLICT: what conflicts."""
    attempt: int = 0
    """For POISONED and CANCELLED: the turn's attempts so far."""


@dataclass(frozen=True, kw_only=True)
class Finished:
    """The outcome of ending an owned turn."""

    stored: bool
    """False when the lease was lost: nothing was written."""
    next_turn: NextTurn | None = None
    """The session's next queued turn, to send now (found in the same transaction)."""


def history_head_of(rows: list[dict[str, Any]] | None) -> tuple[HistoryRow, ...] | None:
    """The claim statement's `history_head` (JSON rows) as `models.history` reads them."""
    if rows is None:
        return None
    return tuple(
        HistoryRow(
            position=int(row["position"]),
            turn_id=uuid.UUID(row["turn_id"]),
            role=row["role"],
            content=row["content"],
            tool_calls=row["tool_calls"] or None,
            tool_call_id=row["tool_call_id"],
        )
        for row in rows
    )

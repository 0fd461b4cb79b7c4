"""Deciding on tool calls that wait for a person (docs/contract.md, "Approvals"): the producer API.

`decide_tool_call` records one decision (approve, approve with edited arguments, deny with a
reason) on a call of a paused turn (`awaiting_approval`); after the last decision of its round the
turn is queued again and sent, and resumes from its journal. `pending_approvals` lists what waits.
Both are tenant-scoped like the rest of the API: another tenant's turn is not found. The
producer API (`worker.producer`) exports them, with its schema check.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from redis import RedisError

from chatq.masking import mask_secrets
from handlers.approvals import Decision, PendingCall, args_problem
from models.db import get_engine
from worker.dispatch import send_next
from worker.errors import InvalidTurn
from worker.events import get_redis
from worker.payload import check_text, parse_uuid
from worker.store import approvals

__all__ = ["Decided", "DecidedCalls", "decide_tool_call", "decide_turn", "pending_approvals"]

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What `decide_tool_call` did."""

    turn_id: uuid.UUID
    """The turn."""
    call_id: str
    """The call decided."""
    resumed: bool
    """True: that was the last decision its round waited for; the turn is queued again and sent."""


@dataclass(frozen=True, kw_only=True)
class DecidedCalls:
    """What `decide_turn` did."""

    turn_id: uuid.UUID
    """The turn."""
    calls: tuple[str, ...]
    """The calls decided (every one that waited)."""
    resumed: bool
    """True: its round waits for nothing more; the turn is queued again and sent."""


def _check_args(call: PendingCall, decision: Decision) -> Decision:
    """Edited arguments must fit the tool's schema; approving without them runs the call as made."""
    if not decision.approve or decision.args is None:
        return decision
    from handlers import framework_names
    from handlers.errors import UnknownTool
    from handlers.tool_registry import get_tool

    framework_names()  # imports CHATQ_PLUGINS, whose tools register themselves
    try:
        tool = get_tool(call.name)
    except UnknownTool:
        raise InvalidTurn(f"cannot check the arguments: tool {call.name!r} is not registered here") from None
    problem = args_problem(tool.parameters, decision.args)
    if problem:
        raise InvalidTurn(f"args for {call.name}: {problem}")
    return replace(decision, args=dict(decision.args))


def decide_tool_call(
    turn_id: uuid.UUID | str,
    call_id: str,
    *,
    approve: bool,
    args: Mapping[str, Any] | None = None,
    reason: str | None = None,
    tenant: str | None = None,
) -> Decided:
    """Approve (with `args`, edited arguments, if given) or deny (with `reason`) a waiting tool call.

    TurnNotFound for a turn that does not exist or is another tenant's; ApprovalConflict when the
    turn is not awaiting approval or the call is not waiting (decided already: HTTP 409);
    ApprovalExpired after the deadline (410); InvalidTurn for arguments the tool's schema refuses.
    """
    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidTurn("call_id must be the id of a waiting tool call")
    decision = _decision(approve=approve, args=args, reason=reason)
    decided = _decide(turn_uuid, {call_id: decision}, tenant=tenant)
    log.info("turn %s: call %s %s", turn_uuid, call_id, "approved" if approve else "denied")
    return Decided(turn_id=turn_uuid, call_id=call_id, resumed=decided.resumed)


def decide_turn(
    turn_id: uuid.UUID | str,
    *,
    approve: bool,
    args: Mapping[str, Any] | None = None,
    reason: str | None = None,
    tenant: str | None = None,
) -> DecidedCalls:
    """The same decision on every call of the turn that waits, in one transaction (`POST /turns/{id}/approvals`
    without a `call_id`). Raises as `decide_tool_call` does; ApprovalConflict when no call waits, and
    InvalidTurn for `args` while more than one call waits (name the call they are for)."""
    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    every = _decision(approve=approve, args=args, reason=reason)
    decided = _decide(turn_uuid, {}, tenant=tenant, every=every)
    log.info("turn %s: %d call(s) %s", turn_uuid, len(decided.calls), "approved" if approve else "denied")
    return DecidedCalls(turn_id=turn_uuid, calls=decided.calls, resumed=decided.resumed)


def _decision(*, approve: bool, args: Mapping[str, Any] | None, reason: str | None) -> Decision:
    if not isinstance(approve, bool):
        raise InvalidTurn(f"approve must be true or false, got {type(approve).__name__}")
    if args is not None and (not approve or not isinstance(args, Mapping)):
        raise InvalidTurn("args must be a JSON object, and only with approve")
    if reason is not None:
        reason = check_text(reason, "reason")[:MAX_REASON_CHARS]
    return Decision(approve=approve, args=args, reason=reason)


def _decide(
    turn_id: uuid.UUID, decisions: Mapping[str, Decision], *, tenant: str | None, every: Decision | None = None
) -> approvals.Decided:
    decided = approvals.decide_calls(
        turn_id, decisions, engine=get_engine(), tenant=tenant, check=_check_args, every=every
    )
    if decided.resumed:
        try:
            send_next(decided.next_turn, client=get_redis())
        except RedisError as exc:  # queued in Postgres: the sweeper sends it
            log.warning("turn %s: could not send it after the decision: %s", turn_id, mask_secrets(str(exc)))
    return decided


def pending_approvals(*, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Paused turns and their waiting calls, nearest deadline first:
    `{"turn_id", "session_id", "until" (Unix time), "calls": [{"id", "name", "args"}]}`."""
    return approvals.list_pending(engine=get_engine(), tenant=tenant, limit=max(1, min(int(limit), 1000)))

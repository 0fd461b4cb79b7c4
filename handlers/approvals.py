"""Human approval of tool calls: which calls need it, the decisions, and the gate a round passes.

A call needs a person's approval when its tool says so (`Tool(..., approval=True)`) or its
session's `approval` asks for it (`none`, `paid`, `all`, or a list of tool names; stored in the
session's metadata, checked with `parse_approval`). Before any call of a round runs, the adapter
hands the round to `gate_round`: when a call that needs approval has no decision yet, the gate
records the round's undecided calls in the journal (`approval_pending`) and raises
`AwaitingApproval`, which the worker turns into the paused status `awaiting_approval` (nothing
held: no thread, no connection, no model slot). A decision (`worker.approvals.decide_tool_call`)
is a journal entry of its own (`approval_decided`); after the round's last one the turn is queued
again and resumes from the journal, where `run_tool` runs an approved call once (with its edited
arguments) and answers a denied one with a result that says so and why.

Approval needs the worker's journal: without one (a caller of the public contract) a call that
needs approval is not run, and the model reads why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from handlers.errors import AwaitingApproval

if TYPE_CHECKING:
    from handlers.context import ToolContext

__all__ = [
    "APPROVAL_MODES",
    "ApprovalPolicy",
    "Decision",
    "PendingCall",
    "args_problem",
    "denied_result",
    "gate_round",
    "parse_approval",
]

APPROVAL_MODES = ("none", "paid", "all")
"""The named settings of a session's `approval`; a list of tool names is the fourth form."""

UNAVAILABLE = "Error: this call needs a person's approval, which can only be asked for in a turn a chatq worker runs."

APPROVAL_ERROR = "approval must be none, paid, all or a list of tool names"


def parse_approval(value: object) -> str | list[str]:
    """A session's `approval` as stored: `none`, `paid`, `all` or a list of tool names. Raises
    ValueError (one line) for anything else."""
    if value is None:
        return "none"
    if isinstance(value, str):
        if value in APPROVAL_MODES:
            return value
        raise ValueError(f"{APPROVAL_ERROR}, got {value[:40]!r}")
    if isinstance(value, list | tuple):
        names = list(dict.fromkeys(value))
        for name in names:
            if (
                not isinstance(name, str)
                or not name
                or len(name) > 64
                or not all(c.isalnum() or c in "_-" for c in name)
            ):
                raise ValueError(f"{APPROVAL_ERROR}; {str(name)[:40]!r} is not a tool name")
        return names
    raise ValueError(f"{APPROVAL_ERROR}, got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class ApprovalPolicy:
    """Which tool calls of a session need approval, besides those of tools with `approval=True`."""

    mode: str = "none"
    """`none`, `paid` (every paid tool), `all`, or `tools` (those named in `tools`)."""
    tools: frozenset[str] = frozenset()
    """The tools named (mode `tools`)."""

    @classmethod
    def of(cls, value: object) -> ApprovalPolicy:
        """The policy of a session's stored `approval`; a value that does not parse asks for every call
        (a setting nobody can read is no reason to run a tool unasked)."""
        try:
            parsed = parse_approval(value)
        except ValueError:
            return cls(mode="all")
        if isinstance(parsed, list):
            return cls(mode="tools", tools=frozenset(parsed))
        return cls(mode=parsed)

    def covers(self, name: str, *, paid: bool = False, approval: bool = False) -> bool:
        """Whether a call of tool `name` (`paid`, itself asking for `approval`) needs approval."""
        return approval or self.mode == "all" or (self.mode == "paid" and paid) or name in self.tools


@dataclass(frozen=True, kw_only=True)
class PendingCall:
    """A tool call that waits for a person's decision."""

    id: str
    """The call id."""
    name: str
    """The tool."""
    args: Mapping[str, Any]
    """The arguments the model gave."""

    def to_dict(self) -> dict[str, Any]:
        """`{"id", "name", "args"}`, as in events."""
        return {"id": self.id, "name": self.name, "args": dict(self.args)}


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A person's decision on one tool call."""

    approve: bool
    """True: run the call; False: do not, and tell the model."""
    args: Mapping[str, Any] | None = None
    """Approved with these arguments instead of the model's (already checked against the tool's schema)."""
    reason: str | None = None
    """Why (a denial's reason reaches the model)."""
    timed_out: bool = False
    """True: nobody decided before the deadline, and the sweep denied the call."""

    def to_dict(self) -> dict[str, Any]:
        """As stored in the journal."""
        args = None if self.args is None else dict(self.args)
        return {"approve": self.approve, "args": args, "reason": self.reason, "timed_out": self.timed_out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        """From `to_dict`'s form."""
        args = data.get("args")
        return cls(
            approve=bool(data.get("approve")),
            args=dict(args) if isinstance(args, Mapping) else None,
            reason=data.get("reason"),
            timed_out=bool(data.get("timed_out")),
        )


def denied_result(reason: str | None) -> str:
    """The tool result a denied call gets: the model reads that it did not run, and why."""
    return f"Error: a person denied this call, so it did not run. Reason: {reason or 'none given'}."


def needs_approval(context: ToolContext | None, tool: ToolLike | None) -> bool:
    """Whether a call of `tool` in `context` needs approval (an unknown tool never runs, so no)."""
    if tool is None:
        return False
    policy = context.approval if context is not None and context.approval is not None else ApprovalPolicy()
    return policy.covers(tool.name, paid=tool.paid, approval=tool.approval)


class ToolLike(Protocol):
    """What the policy reads of a tool (`handlers.tool_registry.Tool`)."""

    @property
    def name(self) -> str: ...
    @property
    def paid(self) -> bool: ...
    @property
    def approval(self) -> bool: ...


def gate_round(
    context: ToolContext, calls: Sequence[Mapping[str, Any]], *, lookup: Callable[[str], ToolLike | None]
) -> None:
    """Let a round of tool calls run only when every call that needs approval has a decision.

    Called before any call of the round runs, so a round pauses as one. Calls the model made
    with unparsable arguments (None) are answered with an error, never asked about. Without a
    journal nothing can wait, and `run_tool` refuses such calls instead. Raises `AwaitingApproval`
    after recording the undecided calls (`approval_pending`, once each). `lookup` finds a
    registered tool by name (`handlers.tools.gate_round` passes the registry's).
    """
    journal, resumed = context.journal, context.resumed
    if journal is None:
        return
    open_round = {str(call.get("id")) for call in resumed.pending} if resumed is not None else set()
    waiting: list[PendingCall] = []
    for call in calls:
        call_id = str(call.get("id") or "")
        args = call.get("args")
        if not call_id or not isinstance(args, Mapping) or not needs_approval(context, lookup(str(call.get("name")))):
            continue
        if (
            resumed is not None
            and call_id in open_round
            and (call_id in resumed.decisions or call_id in resumed.results)
        ):
            continue
        waiting.append(PendingCall(id=call_id, name=str(call["name"]), args=dict(args)))
    if not waiting:
        return
    for pending in waiting:
        if resumed is None or pending.id not in open_round or pending.id not in resumed.awaiting:
            journal.approval_pending(pending.id, pending.name, pending.args)
    raise AwaitingApproval(calls=tuple(waiting))


# --- edited arguments: the tool's JSON schema, the part tools use ------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def args_problem(schema: Mapping[str, Any], args: object) -> str | None:
    """What is wrong with `args` for a tool whose parameters are `schema` (None: nothing).

    Checks what tools' schemas say in practice: an object, its required and unknown properties
    (`additionalProperties: false`), each property's type, enum, bounds and lengths.
    """
    if not isinstance(args, Mapping):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if name not in args:
            return f"argument {name!r} is required"
    for name, value in args.items():
        spec = properties.get(name)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"unknown argument {str(name)[:40]!r}; the tool takes: {', '.join(properties) or 'none'}"
            continue
        problem = _value_problem(spec, value)
        if problem:
            return f"argument {name!r} {problem}"
    return None


def _value_problem(spec: Mapping[str, Any], value: Any) -> str | None:
    kinds = spec.get("type")
    if kinds is not None:
        names = [kinds] if isinstance(kinds, str) else list(kinds)
        allowed = tuple(t for n in names for t in _TYPES.get(n, (object,)))
        if isinstance(value, bool) and bool not in allowed:
            return f"must be {' or '.join(names)}, got boolean"
        if not isinstance(value, allowed):
            return f"must be {' or '.join(names)}, got {type(value).__name__}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            return f"must be at least {spec['minimum']}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"must be at most {spec['maximum']}"
    if isinstance(value, str):
        if "minLength" in spec and len(value) < spec["minLength"]:
            return f"must be at least {spec['minLength']} characters"
        if "maxLength" in spec and len(value) > spec["maxLength"]:
            return f"must be at most {spec['maxLength']} characters"
    return None

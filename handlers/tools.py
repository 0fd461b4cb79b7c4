"""The framework-neutral tool registry and chatq's built-in tools.

Tools are plain Python functions with a JSON-schema description; each framework adapter wraps them
in its own tool type (see `handlers/langgraph/tools.py`), so a tool is written once for every
framework. `run_tool` is the one way to execute a tool: it never raises, it returns failures as
`"Error: ..."` strings the model can read and recover from, and it cuts long output.

Tools that need the turn they run in (the session's knowledge bases, the turn to bill) read it
from `handlers.context.current_tool_context()`; `run_tool(..., context=...)` sets it for the call
and records paid tools (`handlers.accounting.record_tool_call`) before running them.
"""

from __future__ import annotations

import ast
import logging
import math
import operator
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from chatq.settings import mask_secrets
from chatq.text import clean_text
from handlers import approvals
from handlers.approvals import UNAVAILABLE, denied_result, needs_approval
from handlers.context import ToolContext, current_tool_context, use_tool_context
from handlers.errors import OutcomeUnknown, UnknownTool
from handlers.handler_settings import ToolSettings, process_handler_settings
from handlers.knowledge_search import search_tool
from handlers.messages import AgentMessage

__all__ = [
    "KNOWLEDGE_BASE_TOOL",
    "Tool",
    "calculate",
    "current_time",
    "default_tool_names",
    "gate_round",
    "get_tool",
    "list_tools",
    "register_tool",
    "run_tool",
    "session_tool_names",
    "tool_settings",
    "truncate_output",
    "unregister_tool",
]

logger = logging.getLogger(__name__)

TRUNCATION_MARK = " [output truncated]"

UNRECORDED = "Error: this paid tool is unavailable right now (its use could not be recorded)."

KNOWLEDGE_BASE_TOOL = "search_knowledge_base"
"""Searches the session's knowledge bases; bound only when the session has some attached."""


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool the model may call."""

    name: str
    """Unique name the model uses to call the tool (letters, digits, `_` and `-`)."""
    description: str
    """What the tool does and when to use it; the model reads this."""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema (type "object") of the keyword arguments the tool takes."""
    func: Callable[..., str]
    """The implementation: called with the model's arguments as keywords, returns the result text."""
    paid: bool = False
    """True if a call costs money; paid tools are never on by default, a session must ask for them.
    Each call that runs inside a handler invocation is recorded (`handlers.accounting`)."""
    price: float = 0.0
    """Default price of one call of a paid tool; the `tools` part of `CHATQ_PRICES` overrides it."""
    repeatable: bool = False
    """True if running a call twice does no harm (it only reads). A call that started in an earlier
    attempt of the turn and whose result was never recorded is run again only then; else the turn
    fails with `handlers.errors.OutcomeUnknown` (docs/contract.md, "Durable steps")."""
    approval: bool = False
    """True if a person must approve each call before it runs (`handlers.approvals`): the turn pauses
    until the call is approved (perhaps with edited arguments) or denied; a session can ask for more."""


_lock = threading.Lock()
_registry: dict[str, Tool] = {}


def register_tool(tool: Tool, *, replace: bool = False) -> Tool:
    """Add `tool` to the registry (one line per new tool); a second tool of the same name needs `replace`."""
    if not tool.name or not all(c.isalnum() or c in "_-" for c in tool.name):
        raise ValueError(f"invalid tool name {tool.name!r}")
    if tool.parameters.get("type") != "object":
        raise ValueError(f"tool {tool.name!r}: parameters must be a JSON schema of type 'object'")
    with _lock:
        if tool.name in _registry and not replace:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        _registry[tool.name] = tool
    return tool


def unregister_tool(name: str) -> None:
    """Remove a tool from the registry (plugins unloading, tests); unknown names are ignored."""
    with _lock:
        _registry.pop(name, None)


def get_tool(name: str) -> Tool:
    """The registered tool called `name`; raises UnknownTool if there is none."""
    with _lock:
        tool = _registry.get(name)
    if tool is None:
        raise UnknownTool(f"Unknown tool {name!r}; registered tools: {', '.join(list_tool_names()) or 'none'}.")
    return tool


def list_tools() -> list[Tool]:
    """All registered tools, in registration order."""
    with _lock:
        return list(_registry.values())


def list_tool_names() -> list[str]:
    """Names of all registered tools, in registration order."""
    return [tool.name for tool in list_tools()]


def default_tool_names() -> tuple[str, ...]:
    """The tools a session gets unless it names its own: every registered tool that is not paid."""
    return tuple(tool.name for tool in list_tools() if not tool.paid)


def session_tool_names(requested: object, knowledge_bases: Sequence[str] = ()) -> tuple[str, ...]:
    """The tools of a session: `requested` (its `metadata["tools"]`) when it lists names, else the defaults.

    `search_knowledge_base` is bound exactly when the session has knowledge bases attached,
    whatever the session asked for. Raises UnknownTool for a requested name that does not exist.
    """
    if isinstance(requested, list | tuple) and all(isinstance(n, str) for n in requested):
        names = tuple(get_tool(name).name for name in dict.fromkeys(requested))
    else:
        names = default_tool_names()
    names = tuple(name for name in names if name != KNOWLEDGE_BASE_TOOL)
    return (*names, KNOWLEDGE_BASE_TOOL) if knowledge_bases else names


def run_tool(name: str, args: Mapping[str, Any] | None, *, context: ToolContext | None = None) -> str:
    """Run a tool and return its output text; failures come back as `"Error: ..."`, never raised.

    The model reads the error and can correct itself (tools never raise into the graph); the output is
    cut at `CHATQ_MAX_TOOL_OUTPUT_CHARS` so one tool cannot flood the context window.

    `context` (default: the current one, see `handlers.context`) is what the tool sees of its turn,
    and carries the output limit and prices (`ToolContext.settings`; without them, this process's);
    a paid tool run with a context is recorded before it runs, once per call.

    With a journal on the context (`handlers.journal`) each call runs at most once per turn, in
    every attempt: a call whose result an earlier attempt recorded returns it without running (and
    without a paid-call record); one that started without a recorded result runs again only if its
    tool is `repeatable` (under the same `idempotency_key`), else `OutcomeUnknown` is raised;
    any other call is recorded as started, run, and its result recorded. A call that needs a
    person's approval (`handlers.approvals`) runs only once approved (with the arguments the
    decision gives), is answered as denied, or raises `AwaitingApproval` while undecided (without
    a journal it is not run). Those errors, and a journal write that fails (`StepNotRecorded`),
    are the only ones raised.
    """
    ctx = context if context is not None else current_tool_context()
    journal = ctx.journal if ctx is not None and ctx.tool_call_id is not None else None
    if journal is None or ctx is None or ctx.tool_call_id is None:
        if needs_approval(ctx, _registered(name)):
            return UNAVAILABLE  # nothing could wait for the decision (`handlers.approvals`)
        return _run_tool(name, args, ctx, context)
    call_id = ctx.tool_call_id
    resumed = ctx.resumed
    if resumed is not None and call_id in resumed.results:
        return resumed.results[call_id]
    decision = resumed.decisions.get(call_id) if resumed is not None else None
    if decision is None:
        # The adapters gate each round before it runs; this catches a call that skipped the gate.
        gate_round(ctx, [{"id": call_id, "name": name, "args": args}])
    elif not decision.approve:
        output = denied_result(decision.reason)
        journal.tool_finished(call_id, _result_message(call_id, output, []))
        return output
    elif decision.args is not None:
        args = decision.args
    if resumed is not None and call_id in resumed.started:
        tool = _registered(name)
        if tool is None or not tool.repeatable:
            raise OutcomeUnknown(call_id=call_id, tool=name)
        logger.info("tool %s call %s: repeating a call whose outcome was not recorded (repeatable)", name, call_id)
    else:
        journal.tool_started(call_id, name)
    found = len(ctx.retrieved.hits())
    output = _run_tool(name, args, ctx, context)
    journal.tool_finished(call_id, _result_message(call_id, output, ctx.retrieved.hits()[found:]))
    return output


def tool_settings(context: ToolContext | None) -> ToolSettings:
    """The output limit and prices a call runs with: its context's (the worker's, handed in by
    `build_turn_input`), else, outside a turn, this process's (`handlers.handler_settings`)."""
    settings = context.settings if context is not None else None
    return settings if settings is not None else process_handler_settings().tools


def gate_round(context: ToolContext, calls: Sequence[Mapping[str, Any]]) -> None:
    """Before a round of calls runs: raise `AwaitingApproval` while a call that needs approval has no
    decision, its waiting calls recorded (`handlers.approvals.gate_round`, on this registry)."""
    approvals.gate_round(context, calls, lookup=_registered)


def _run_tool(name: str, args: Mapping[str, Any] | None, ctx: ToolContext | None, context: ToolContext | None) -> str:
    """The call itself: the paid record, the tool, its output cut to size; every failure an `Error: ...` text."""
    settings = tool_settings(ctx)
    limit = settings.max_output_chars
    try:
        tool = get_tool(name)
        if args is not None and not isinstance(args, Mapping):
            raise TypeError("arguments must be a JSON object")
        if tool.paid and ctx is not None and ctx.session_id is not None and not _record_paid_call(tool, ctx, settings):
            return UNRECORDED
        with use_tool_context(context):
            output = tool.func(**dict(args or {}))
        text = output if isinstance(output, str) else str(output)
    except Exception as exc:
        logger.info("tool %s failed: %s", name, type(exc).__name__)
        # The model reads it and the turn stores it: an exception's text may hold a secret.
        return truncate_output(f"Error: {mask_secrets(_describe(exc))}", limit)
    return truncate_output(text, limit)


def _registered(name: str) -> Tool | None:
    with _lock:
        return _registry.get(name)


def _result_message(call_id: str, output: str, hits: list[dict[str, Any]]) -> AgentMessage:
    """The `tool` message a call's result is recorded as; its citations hold the knowledge-base hits
    the call found (a resumed attempt gets them back for the reply's citations)."""
    return AgentMessage(role="tool", content=output, tool_call_id=call_id, citations=hits or None)


def _record_paid_call(tool: Tool, ctx: ToolContext, settings: ToolSettings) -> bool:
    """Record a paid call before it runs, at the price `settings` give it; False (logged, the call
    is not run) if that fails."""
    from handlers.accounting import load_prices, record_tool_call

    turn = ctx.turn
    try:
        record_tool_call(
            unit_price=load_prices(settings.prices).tool_price(tool.name, tool.price),
            tool_name=tool.name,
            tool_call_id=ctx.tool_call_id or f"uncalled-{uuid.uuid4().hex}",
            invocation_id=ctx.invocation_id,
            session_id=ctx.session_id,
            turn_id=turn.turn_id if turn is not None else None,
            attempt=turn.attempt if turn is not None else None,
            recorder=ctx.recorder,
        )
    except Exception as exc:
        # The detail (database or price table) is for operators, not for the model or the stored turn.
        logger.warning("paid tool %s not run: recording the call failed: %s", tool.name, mask_secrets(str(exc))[:300])
        return False
    return True


def truncate_output(text: str, limit: int) -> str:
    """Cut `text` to at most `limit` characters (the tool output limit, `ToolSettings.max_output_chars`),
    with NULs and lone surrogates made U+FFFD: the output goes back to the model and into Postgres."""
    text = clean_text(text)
    if len(text) <= limit:
        return text
    return text[: max(limit - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnknownTool):
        return exc.message
    if isinstance(exc, KeyError):
        # KeyError's str() is the quoted key, which reads badly to a model.
        return f"missing key {exc.args[0]!r}" if exc.args else "missing key"
    return str(exc) or type(exc).__name__


# --- calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4_096  # keeps every intermediate result printable and the work per call tiny

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

Number = int | float


def calculate(expression: str) -> Number:
    """Evaluate arithmetic (numbers, + - * / // % **, unary +-, parentheses) by walking the AST.

    Nothing is ever passed to `eval`: names, calls, attributes, subscripts and every other node are
    rejected, and exponents and integer sizes are bounded so a call cannot eat the worker's CPU.
    """
    if not isinstance(expression, str):
        raise TypeError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise ValueError("expression is nested too deeply") from None
    except OverflowError:
        raise ValueError("result is too large") from None


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed: {node.id!r}")
    if isinstance(node, ast.Attribute):
        raise ValueError("attribute access is not allowed")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed")
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is too large (limit {MAX_EXPONENT})")
    # Refuse before computing: an integer result would have about bits(base) * exponent bits.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS
    ):
        raise ValueError("result is too large")
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise ValueError("fractional power of a negative number")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ValueError("complex results are not supported")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError("result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    if not isinstance(value, int | float):
        raise ValueError("result is not a number")
    return value


def format_number(value: Number) -> str:
    """Render a result: integers exactly, floats with 15 significant digits (6/3 -> "2")."""
    if isinstance(value, int):
        return str(value)
    return format(value, ".15g")


def _calculator(expression: str) -> str:
    return format_number(calculate(expression))


# --- current_time ----------------------------------------------------------------------------


MAX_TIMEZONE_CHARS = 64
"""Longer than any IANA time zone name (the longest are about 30 characters)."""

_TIMEZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*")
"""The shape of an IANA name ("America/Argentina/Buenos_Aires", "Etc/GMT+5"): no dots, no empty parts."""


def current_time(timezone: str = "UTC") -> str:
    """The current time in `timezone` (an IANA name such as "Europe/Paris"), ISO 8601.

    The name is checked before it reaches `zoneinfo`, which turns it into a file path: an odd name
    gets "unknown time zone", never an operating-system error that would show the model a path.
    """
    if not isinstance(timezone, str) or not timezone.strip():
        raise ValueError("timezone must be an IANA time zone name such as 'UTC' or 'Europe/Paris'")
    name = timezone.strip()
    if name.upper() in ("UTC", "Z", "GMT"):
        return datetime.now(UTC).isoformat(timespec="seconds")
    if len(name) > MAX_TIMEZONE_CHARS:
        raise ValueError(f"unknown time zone: names are at most {MAX_TIMEZONE_CHARS} characters, like 'Europe/Paris'")
    if not _TIMEZONE_NAME.fullmatch(name):
        raise ValueError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris'")
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}") from None
    return datetime.now(zone).isoformat(timespec="seconds")


register_tool(
    Tool(
        name="calculator",
        description=(
            "Evaluate an arithmetic expression exactly. Supports numbers, + - * / // % ** and parentheses. "
            "Use it for any calculation instead of computing in your head."
        ),
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The arithmetic expression, e.g. '6*7'."}},
            "required": ["expression"],
            "additionalProperties": False,
        },
        func=_calculator,
        repeatable=True,
    )
)
register_tool(
    Tool(
        name="current_time",
        description="The current date and time (ISO 8601) in a time zone; UTC unless one is given.",
        parameters={
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "IANA time zone name such as 'UTC' or 'Europe/Paris'.",
                }
            },
            "additionalProperties": False,
        },
        func=current_time,
        repeatable=True,
    )
)


# --- search_knowledge_base -------------------------------------------------------------------


register_tool(
    Tool(
        name=KNOWLEDGE_BASE_TOOL,
        description=(
            "Search the knowledge bases attached to this conversation (full-text search). Returns the best "
            "matching passages, each with its document title and id; cite the titles of the passages you use."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, in a few keywords or a question."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 10,
                    "description": "How many passages to return (default 5).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        func=search_tool,
        paid=True,
        repeatable=True,  # it only reads; a repeated search is a new paid call, recorded as one
    )
)

"""Running a tool: `run_tool`, the one way to execute one, and its exactly-once logic within a turn.

`run_tool` never raises for a tool's failure: it returns it as an `"Error: ..."` string the model
can read and recover from, and it cuts long output. Tools that need the turn they run in (the
session's knowledge bases, the turn to bill) read it from `handlers.context.current_tool_context()`;
`run_tool(..., context=...)` sets it for the call and records paid tools
(`handlers.accounting.record_tool_call`) before running them.

The registry (`Tool`, `register_tool`, `get_tool`, ...) is `handlers.tool_registry` and the built-in
tools' functions `handlers.builtin_tools`; the registry's names are re-exported here, the path
plugins and adapters import them from (docs/handlers.md).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from chatq.masking import mask_secrets
from chatq.text import clean_text
from handlers import approvals
from handlers.approvals import UNAVAILABLE, denied_result, needs_approval
from handlers.context import ToolContext, current_tool_context, use_tool_context
from handlers.errors import OutcomeUnknown, UnknownTool
from handlers.handler_settings import ToolSettings, process_handler_settings
from handlers.messages import AgentMessage
from handlers.tool_registry import (
    KNOWLEDGE_BASE_TOOL,
    Tool,
    default_tool_names,
    get_tool,
    list_tools,
    register_tool,
    registered_tool,
    session_tool_names,
    unregister_tool,
)

__all__ = [
    "KNOWLEDGE_BASE_TOOL",
    "Tool",
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
        if needs_approval(ctx, registered_tool(name)):
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
        tool = registered_tool(name)
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
    approvals.gate_round(context, calls, lookup=registered_tool)


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

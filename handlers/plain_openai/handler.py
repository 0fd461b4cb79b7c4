"""PlainOpenAIHandler: chat completions on the `openai` SDK, with chatq's tools, in a plain loop.

    [knowledge bases attached: search first] -> model -(tool calls?)-> run tools -> model ... -> reply

The turn arrives prepared (`handlers.turn_input.TurnInput`: history, system prompt, tools, the
first knowledge-base search, the deadline); this adapter only speaks the OpenAI wire format, runs
the tools of the registry (`handlers.tool_registry`) through `handlers.tools.run_tool` and converts
the result to `AgentMessage` at the boundary.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import openai

from chatq.errors import ConfigError
from chatq.settings import ECHO_MODEL
from handlers.base import AgentMessage, StreamEvent, StreamEventKind, Usage, empty_usage
from handlers.chat_models.http import model_http_client  # imports no LangChain either
from handlers.context import ToolContext
from handlers.deadline import Deadline
from handlers.echo import echo
from handlers.errors import TOO_MANY_STEPS, AgentInvocationError
from handlers.handler_settings import ModelEndpoint
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.tool_registry import get_tool
from handlers.tools import gate_round, run_tool
from handlers.turn_input import TurnInput

__all__ = ["MAX_MODEL_CALLS", "TOO_MANY_STEPS", "PlainOpenAIHandler"]

MAX_MODEL_CALLS = 5
"""Model calls per invocation: bounds a model that loops on tools (LangGraph's recursion limit of
10 graph steps allows the same number)."""

NO_KEY_PLACEHOLDER = "chatq-no-key"


class PlainOpenAIHandler(PreparedTurnHandler):
    """The `plain_openai` framework: the same behaviour as `langgraph`, without a framework."""

    def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
        """Text events as tokens arrive, tool started/finished events; returns the turn's messages and usage.

        A resumed turn continues after its finished messages: the open round's calls run first
        (recorded results come back without running, and without events: they streamed before).
        """
        produced: list[AgentMessage] = []
        usage = empty_usage()
        messages: list[dict[str, Any]] = [{"role": "system", "content": turn.system_prompt}]
        messages.extend(_to_openai(m) for m in turn.history)
        messages.append({"role": "user", "content": turn.user_content})
        messages.extend(_to_openai(m.to_dict()) for m in turn.resumed.messages)
        if turn.retrieval is not None:
            # The search already ran; it enters the conversation as if the model had called the tool.
            started, finished = turn.retrieval.events()
            yield started
            produced += _tool_round(messages, "", [turn.retrieval.call], [turn.retrieval.output])
            yield finished
        if turn.resumed.pending:
            # The round an earlier attempt left open: its assistant message is in the conversation already.
            outputs = yield from _run_calls(turn, turn.resumed.pending, skip_events=turn.resumed.results)
            produced += _tool_results(messages, turn.resumed.pending, outputs)
        for _ in range(MAX_MODEL_CALLS):
            step = yield from _complete(turn.model, turn.endpoint, messages, turn.tools, turn.deadline)
            for key in usage:
                usage[key] += step.usage.get(key, 0)
            if not step.calls:
                produced.append(AgentMessage(role="assistant", content=step.text))
                return produced, usage
            call_message = _call_message(messages, step.text, step.calls)
            # Recorded before any of its tools runs: a later attempt continues from this message.
            turn.record_model_step(call_message, step.usage)
            produced.append(call_message)
            outputs = yield from _run_calls(turn, step.calls)
            produced += _tool_results(messages, step.calls, outputs)
        raise AgentInvocationError(TOO_MANY_STEPS)


def _run_calls(
    turn: TurnInput, calls: Sequence[Mapping[str, Any]], *, skip_events: Mapping[str, str] | None = None
) -> Generator[StreamEvent, None, list[str]]:
    """Run a round's calls in order with their started/finished events (none for a call in `skip_events`,
    whose recorded result `run_tool` returns without running it)."""
    outputs: list[str] = []
    # Before any call of the round runs: a call that needs a person's approval pauses the round as one.
    gate_round(turn.tool_context, calls)
    for call in calls:
        turn.deadline.check()
        quiet = skip_events is not None and call["id"] in skip_events
        if not quiet:
            yield _tool_event(call, "started")
        outputs.append(_run(call, turn.tools, turn.tool_context))
        if not quiet:
            yield _tool_event(call, "finished")
    return outputs


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Step:
    """One model call: its text, the tool calls it asks for (`{"id", "name", "args"}`), its usage."""

    text: str
    calls: list[dict[str, Any]]
    usage: Usage


def _complete(
    model: str, endpoint: ModelEndpoint, messages: list[dict[str, Any]], tools: Sequence[str], deadline: Deadline
) -> Generator[StreamEvent, None, _Step]:
    """Stream one chat completion, yielding its text as it comes; returns the whole step."""
    deadline.check()
    if model == ECHO_MODEL:
        return (yield from _echo(messages))
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        # The rest of the turn's time: a silent server is cut off by the HTTP client.
        "timeout": max(deadline.remaining(), 0.01),
    }
    if tools:
        request["tools"] = [_tool_spec(name) for name in tools]
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = empty_usage()
    stream: Any = _client(model, endpoint).chat.completions.create(**request)
    try:
        for chunk in stream:
            deadline.check()  # a server that trickles tokens forever is cut off too
            if chunk.usage is not None:
                usage = {
                    "prompt_tokens": chunk.usage.prompt_tokens or 0,
                    "completion_tokens": chunk.usage.completion_tokens or 0,
                    "total_tokens": chunk.usage.total_tokens or 0,
                }
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    yield StreamEvent(kind=StreamEventKind.TEXT, text=delta.content)
                for part in delta.tool_calls or ():
                    call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = part.id or call["id"]
                    if part.function is not None:
                        call["name"] += part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
    finally:
        stream.close()
    return _Step(
        text="".join(text),
        calls=[_parse_call(calls[index]) for index in sorted(calls)],
        usage=usage,
    )


def _echo(messages: list[dict[str, Any]]) -> Generator[StreamEvent, None, _Step]:
    """chatq's offline `echo` model (`handlers.echo`), answered here instead of a request."""
    reply = echo((m["role"], m.get("content")) for m in messages)
    for chunk in reply.chunks:
        yield StreamEvent(kind=StreamEventKind.TEXT, text=chunk)
    return _Step(text=reply.text, calls=[], usage=reply.usage)


def _parse_call(raw: Mapping[str, str]) -> dict[str, Any]:
    try:
        args: Any = json.loads(raw["arguments"] or "{}")
    except json.JSONDecodeError:
        args = None
    return {"id": raw["id"], "name": raw["name"], "args": args if isinstance(args, dict) else None}


def _run(call: Mapping[str, Any], tools: Sequence[str], invocation: ToolContext) -> str:
    """Run one tool call through the registry; every failure is an `Error: ...` result for the model."""
    if call["name"] not in tools:
        return f"Error: unknown tool {call['name']!r}. Use only the tools you were given."
    if call["args"] is None:
        return "Error: the arguments are not a JSON object."
    # run_tool gives the tool its turn (session, knowledge bases, call id) and records paid calls.
    return run_tool(call["name"], call["args"], context=invocation.for_call(call["id"]))


def _tool_round(
    messages: list[dict[str, Any]], text: str, calls: Sequence[Mapping[str, Any]], outputs: Sequence[str]
) -> list[AgentMessage]:
    """Add an assistant tool-call message and its results to the conversation; return them as AgentMessages."""
    return [_call_message(messages, text, calls), *_tool_results(messages, calls, outputs)]


def _call_message(messages: list[dict[str, Any]], text: str, calls: Sequence[Mapping[str, Any]]) -> AgentMessage:
    """Add an assistant message that calls tools to the conversation; return it as an AgentMessage."""
    neutral = [{"id": c["id"], "name": c["name"], "args": c["args"] or {}} for c in calls]
    messages.append(_to_openai({"role": "assistant", "content": text, "tool_calls": neutral}))
    return AgentMessage(role="assistant", content=text, tool_calls=neutral)


def _tool_results(
    messages: list[dict[str, Any]], calls: Sequence[Mapping[str, Any]], outputs: Sequence[str]
) -> list[AgentMessage]:
    """Add the calls' results to the conversation; return them as AgentMessages."""
    produced = []
    for call, output in zip(calls, outputs, strict=True):
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        produced.append(AgentMessage(role="tool", content=output, tool_call_id=call["id"]))
    return produced


def _tool_event(call: Mapping[str, Any], status: str) -> StreamEvent:
    return StreamEvent(kind=StreamEventKind.TOOL, tool={"id": call["id"], "name": call["name"], "status": status})


def _tool_spec(name: str) -> dict[str, Any]:
    tool = get_tool(name)
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }


def _to_openai(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A framework-neutral message dict (`handlers.history`) in the OpenAI chat format."""
    role = payload["role"]
    content = payload.get("content") or ""
    if role == "assistant" and payload.get("tool_calls"):
        return {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call.get("args") or {})},
                }
                for call in payload["tool_calls"]
            ],
        }
    if role == "tool":
        return {"role": "tool", "tool_call_id": payload.get("tool_call_id") or "", "content": content}
    return {"role": role, "content": content}


def _client(model: str, endpoint: ModelEndpoint) -> openai.OpenAI:
    problem = endpoint.unavailable(model)
    if problem:
        raise ConfigError(problem)  # not retried: the same configuration fails the same way
    return _cached_client(endpoint.base_url, endpoint.api_key, endpoint.timeout)


@functools.lru_cache(maxsize=8)
def _cached_client(base_url: str | None, api_key: str | None, timeout: float) -> openai.OpenAI:
    # One client (and connection pool) per process and configuration. chatq retries a failed
    # invocation itself, with events; a hidden SDK retry would double the wait and break the timeout.
    # Its requests stop at once when the turn is cancelled (handlers/abortable_http.py).
    http_client = model_http_client(timeout)
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or NO_KEY_PLACEHOLDER,
        max_retries=0,
        timeout=timeout,
        http_client=http_client,
    )

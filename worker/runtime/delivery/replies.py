"""A handler's reply held to the contract before it is stored: messages, usage, storable text."""

from __future__ import annotations

import dataclasses
import math

from handlers.base import AgentMessage, Usage
from handlers.errors import AgentInvocationError
from worker.storable import INTEGER_MAX, clean_json, clean_text

__all__ = ["storable_message", "validate_reply"]


def validate_reply(messages: object, usage: object) -> tuple[list[AgentMessage], Usage]:
    """Hold handlers to the contract: a non-empty list of AgentMessage and integer usage.

    This is the worker's check for any handler's final event (a plain handler's especially);
    whether a reply is an answer at all is the adapters' template's (`handlers.prepared.is_answer`).

    What the model returned is made storable: characters Postgres cannot hold (NUL, lone
    surrogates) in text, tool-call arguments, tool outputs and citations become U+FFFD, and token
    counts are kept within Postgres integers. Anything else Postgres refuses fails the turn once.
    """
    if not isinstance(messages, list) or not messages or not all(isinstance(m, AgentMessage) for m in messages):
        raise AgentInvocationError("the agent returned no reply")
    clean: Usage = {}
    source = usage if isinstance(usage, dict) else {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = source.get(key, 0)
        if isinstance(value, float):
            value = int(value) if math.isfinite(value) else 0
        clean[key] = min(max(int(value), 0), INTEGER_MAX) if isinstance(value, int) else 0
    if not clean["total_tokens"]:
        clean["total_tokens"] = min(clean["prompt_tokens"] + clean["completion_tokens"], INTEGER_MAX)
    return [storable_message(message) for message in messages], clean


def storable_message(message: AgentMessage) -> AgentMessage:
    """`message` with its text made storable (the same object when nothing needed cleaning)."""
    content = clean_text(message.content) if isinstance(message.content, str) else str(message.content or "")
    tool_calls = clean_json(message.tool_calls) if message.tool_calls else message.tool_calls
    tool_call_id = clean_text(message.tool_call_id) if isinstance(message.tool_call_id, str) else message.tool_call_id
    citations = clean_json(message.citations) if message.citations else message.citations
    if (content, tool_call_id) == (message.content, message.tool_call_id) and (tool_calls, citations) == (
        message.tool_calls,
        message.citations,
    ):
        return message
    return dataclasses.replace(
        message, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id, citations=citations
    )

"""Payload <-> LangChain message normalisation, both ways (what the reactive graph feeds the model and stores).

A payload is chatq's framework-neutral message dict, as `handlers.history` returns and the
database stores it: `{"role", "content", "tool_calls", "tool_call_id"}` with tool calls as
`[{"id", "name", "args"}]`. Tool call ids survive both directions, so a tool result always
stays attached to the call it answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import ToolCall as LCToolCall

from handlers.base import AgentMessage, ToolCall, Usage, empty_usage
from handlers.images import image_url, user_content
from handlers.messages import content_text  # re-exported: the LangChain pieces use it from here

__all__ = [
    "content_text",
    "image_url",
    "langchain_to_payload",
    "payload_to_langchain",
    "payloads_to_langchain",
    "to_agent_message",
    "usage_from",
    "user_message",
]


def _to_lc_tool_calls(calls: Iterable[Mapping[str, Any]] | None) -> list[LCToolCall]:
    result: list[LCToolCall] = []
    for call in calls or ():
        args = call.get("args")
        result.append(
            LCToolCall(
                name=str(call.get("name") or ""),
                args=dict(args) if isinstance(args, Mapping) else {},
                id=str(call["id"]) if call.get("id") is not None else None,
                type="tool_call",
            )
        )
    return result


def _from_lc_tool_calls(calls: Sequence[LCToolCall]) -> list[ToolCall] | None:
    if not calls:
        return None
    return [{"id": call.get("id"), "name": call["name"], "args": dict(call.get("args") or {})} for call in calls]


def payload_to_langchain(payload: Mapping[str, Any]) -> BaseMessage:
    """One payload dict as a LangChain message (system/user/assistant/tool; unknown roles are user)."""
    role = str(payload.get("role") or "user")
    content = payload.get("content")
    if not isinstance(content, str | list):
        content = "" if content is None else str(content)
    if role == "system":
        return SystemMessage(content=content_text(content))
    if role == "assistant":
        return AIMessage(content=content_text(content), tool_calls=_to_lc_tool_calls(payload.get("tool_calls")))
    if role == "tool":
        return ToolMessage(content=content_text(content), tool_call_id=str(payload.get("tool_call_id") or ""))
    # User content may be multimodal (text and image parts): keep the parts.
    return HumanMessage(content=content)


def payloads_to_langchain(payloads: Iterable[Mapping[str, Any]]) -> list[BaseMessage]:
    """A list of payload dicts as LangChain messages, in order."""
    return [payload_to_langchain(p) for p in payloads]


def langchain_to_payload(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as a payload dict; tool_calls and tool_call_id are preserved."""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    if isinstance(message, AIMessage):
        role = "assistant"
        tool_calls = _from_lc_tool_calls(message.tool_calls)
    elif isinstance(message, ToolMessage):
        role = "tool"
        tool_call_id = message.tool_call_id
    elif isinstance(message, SystemMessage):
        role = "system"
    else:
        role = "user"
    return {
        "role": role,
        "content": content_text(message.content),
        "tool_calls": tool_calls,
        "tool_call_id": tool_call_id,
    }


def to_agent_message(message: BaseMessage) -> AgentMessage:
    """A message the agent produced (assistant or tool) as the framework-neutral `AgentMessage`."""
    payload = langchain_to_payload(message)
    if payload["role"] not in ("assistant", "tool"):
        raise ValueError(f"only assistant and tool messages become AgentMessages, got {payload['role']!r}")
    return AgentMessage.from_dict(payload)


def user_message(content: str, images: Sequence[str] | None = None, *, accepts_images: bool = True) -> HumanMessage:
    """The turn's user message (`handlers.images.user_content`: image parts, or a note for a model without images)."""
    return HumanMessage(content=cast(Any, user_content(content, images or (), accepts_images=accepts_images)))


def usage_from(messages: Iterable[BaseMessage]) -> Usage:
    """Token usage summed over the AI messages' usage_metadata, in chatq's key names."""
    usage = empty_usage()
    for message in messages:
        meta = message.usage_metadata if isinstance(message, AIMessage) else None
        if not meta:
            continue
        prompt = int(meta.get("input_tokens") or 0)
        completion = int(meta.get("output_tokens") or 0)
        usage["prompt_tokens"] += prompt
        usage["completion_tokens"] += completion
        usage["total_tokens"] += int(meta.get("total_tokens") or prompt + completion)
    return usage

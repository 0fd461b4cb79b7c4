"""The boundary types of the agent contract: messages, stream events, usage, the session a handler serves.

The worker talks only to these types (and `handlers.base.BaseAgentHandler`, which re-exports them);
each framework adapter converts its native messages to `AgentMessage` at the boundary, so nothing
outside `handlers/<framework>/` imports an agent framework.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "AgentMessage",
    "AgentSession",
    "SessionInfo",
    "StreamEvent",
    "StreamEventKind",
    "ToolCall",
    "Usage",
    "content_text",
    "empty_usage",
]

Usage = dict[str, int]
"""Token usage: `prompt_tokens`, `completion_tokens`, `total_tokens`."""

ToolCall = dict[str, Any]
"""One tool call as the model asked for it: `{"id", "name", "args"}`."""


def content_text(content: object) -> str:
    """The text of a message's content (a string, or OpenAI/LangChain parts): text parts joined, others dropped."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def empty_usage() -> Usage:
    """Usage of a call that used no tokens."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


@dataclass(frozen=True, kw_only=True)
class AgentMessage:
    """One message the agent produced during a turn: the common boundary type."""

    role: str
    """`"assistant"` or `"tool"`."""
    content: str
    """The text of the message (a tool's result for `"tool"`)."""
    tool_calls: list[ToolCall] | None = None
    """Tools an assistant message asks for, `[{"id", "name", "args"}]`."""
    tool_call_id: str | None = None
    """For a `"tool"` message, the id of the call it answers."""
    citations: list[dict[str, Any]] | None = None
    """For the final assistant message of a session with knowledge bases: the passages the answer is
    based on, `[{"document_id", "title", "chunk_id", "snippet"}]` (see `handlers.knowledge`)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used in events and `chatq show --json`."""
        return {
            "role": self.role,
            "content": self.content,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "citations": self.citations,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentMessage:
        """Build a message from its JSON form."""
        return cls(
            role=str(data["role"]),
            content=str(data.get("content") or ""),
            tool_calls=list(data["tool_calls"]) if data.get("tool_calls") else None,
            tool_call_id=data.get("tool_call_id"),
            citations=[dict(c) for c in data["citations"]] if data.get("citations") else None,
        )


class StreamEventKind(enum.StrEnum):
    """What a handler's stream event carries."""

    TEXT = "text"
    TOOL = "tool"
    FINAL = "final"


@dataclass(frozen=True, kw_only=True)
class StreamEvent:
    """What a handler yields while it streams."""

    kind: str
    """`"text"`, `"tool"` or `"final"` (a `StreamEventKind`)."""
    text: str = ""
    """The next chunk of reply text (`"text"`)."""
    tool: dict[str, Any] | None = None
    """`{"id", "name", "status": "started" | "finished"}` (`"tool"`)."""
    response: Any = None
    """What `invoke()` would return first: the list of `AgentMessage` (`"final"`)."""
    usage: Usage | None = None
    """Token usage of the whole invocation (`"final"`)."""


@runtime_checkable
class AgentSession(Protocol):
    """What a handler needs to know of the chat session it serves (the ORM row satisfies it)."""

    @property
    def id(self) -> Any: ...
    @property
    def agent_framework(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def system_prompt(self) -> str | None: ...
    @property
    def metadata_(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """A detached, immutable view of a chat session, safe to hand to a handler in any thread."""

    id: Any
    """The session id (a UUID)."""
    agent_framework: str
    """`"langgraph"`, `"none"` or another registered framework (see `handlers.FRAMEWORK_CHOICES`)."""
    model: str | None
    """The model name (`echo` is the built-in offline model); None: the running process's default
    (`Settings.session_model`)."""
    system_prompt: str | None = None
    """The session's own instructions, placed before chatq's shared policy."""
    metadata_: Mapping[str, Any] | None = field(default=None)
    """Free-form session metadata."""
    knowledge_bases: tuple[str, ...] | None = None
    """Names of the attached knowledge bases, sorted, as read when the turn was claimed; None when
    not known (the handler then looks them up itself)."""

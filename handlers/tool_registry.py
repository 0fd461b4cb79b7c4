"""The framework-neutral tool registry: the `Tool` value object, the registry's functions, and
chatq's built-in tools registered in it (their functions are `handlers.builtin_tools` and
`handlers.knowledge_search`).

Tools are plain Python functions with a JSON-schema description; each framework adapter wraps them
in its own tool type (see `handlers/langgraph/tools.py`), so a tool is written once for every
framework. They run through `handlers.tools.run_tool`, which also re-exports this module's public
names (`handlers.tools` is the path plugins and adapters import them from).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handlers.builtin_tools import calculator, current_time
from handlers.errors import UnknownTool
from handlers.knowledge_search import search_tool

__all__ = [
    "KNOWLEDGE_BASE_TOOL",
    "Tool",
    "default_tool_names",
    "get_tool",
    "list_tool_names",
    "list_tools",
    "register_tool",
    "registered_tool",
    "session_tool_names",
    "unregister_tool",
]

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


def registered_tool(name: str) -> Tool | None:
    """The registered tool called `name`, or None if there is none."""
    with _lock:
        return _registry.get(name)


# --- the built-in tools ------------------------------------------------------------------------

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
        func=calculator,
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

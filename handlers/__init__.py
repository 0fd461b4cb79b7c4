"""chatq's agent handlers: the framework-agnostic contract and the handler factory.

Importing `handlers` imports no agent framework: an adapter module is imported the first time a
session of its framework needs a handler. A new framework plugs in with one entry in `_ADAPTERS`
(or a `register_framework` call).
"""

from __future__ import annotations

import importlib
from typing import Any

from handlers.base import (
    AgentMessage,
    AgentSession,
    BaseAgentHandler,
    SessionInfo,
    StreamEvent,
    StreamEventKind,
    Usage,
    empty_usage,
)
from handlers.errors import AgentInvocationError, HandlerError, ThreadHopError, UnknownFramework, UnknownTool

__all__ = [
    "FRAMEWORK_CHOICES",
    "AgentInvocationError",
    "AgentMessage",
    "AgentSession",
    "BaseAgentHandler",
    "HandlerError",
    "SessionInfo",
    "StreamEvent",
    "StreamEventKind",
    "ThreadHopError",
    "UnknownFramework",
    "UnknownTool",
    "Usage",
    "empty_usage",
    "framework_names",
    "get_agent_handler",
    "load_handler_class",
    "register_framework",
]

_ADAPTERS: dict[str, tuple[str, str]] = {
    # framework: (label, "module:class" of its BaseAgentHandler, imported on first use)
    "none": ("None", "handlers.none.handler:NoneHandler"),
    "langgraph": ("LangGraph", "handlers.langgraph.handler:LangGraphHandler"),
    # The worked example of docs/handlers.md: a tool loop on the `openai` SDK, no framework.
    "plain_openai": ("Plain OpenAI SDK", "handlers.plain_openai.handler:PlainOpenAIHandler"),
}

FRAMEWORK_CHOICES: list[tuple[str, str]] = [(name, label) for name, (label, _) in _ADAPTERS.items()]
"""(value, label) of every agent framework a session may use:
`[("none", "None"), ("langgraph", "LangGraph"), ("plain_openai", "Plain OpenAI SDK")]`."""


def register_framework(name: str, label: str, target: str) -> None:
    """Plug in a framework: `target` is "module:Class" of its BaseAgentHandler, imported on first use."""
    if name in _ADAPTERS:
        raise ValueError(f"agent framework {name!r} is already registered")
    _ADAPTERS[name] = (label, target)
    FRAMEWORK_CHOICES.append((name, label))


def framework_names() -> list[str]:
    """The accepted `agent_framework` values."""
    return [value for value, _ in FRAMEWORK_CHOICES]


def load_handler_class(framework: str) -> type[BaseAgentHandler]:
    """The handler class of `framework`, importing its adapter on first use.

    A worker can call this at start-up to pay the framework's import cost (about a second for
    LangGraph + langchain-openai) before its first turn. Raises UnknownFramework.
    """
    entry = _ADAPTERS.get(framework)
    if entry is None:
        raise UnknownFramework(f"Unknown agent framework {framework!r}; choose one of: {', '.join(framework_names())}.")
    module_name, _, class_name = entry[1].partition(":")
    handler_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(handler_class, type) and issubclass(handler_class, BaseAgentHandler)):
        raise TypeError(f"{entry[1]} is not a BaseAgentHandler")
    return handler_class


def get_agent_handler(session: Any) -> BaseAgentHandler:
    """The handler for `session`'s `agent_framework` (an `AgentSession`, e.g. a SessionInfo or the ORM row).

    Raises UnknownFramework for a framework chatq does not know.
    """
    framework = str(getattr(session, "agent_framework", None) or "").strip()
    return load_handler_class(framework)(session)

"""chatq's agent handlers: the framework-agnostic contract and the handler factory.

Importing `handlers` imports no agent framework: an adapter module is imported the first time a
session of its framework needs a handler. A new framework plugs in with one entry in `_ADAPTERS`
(or a `register_framework` call from a `CHATQ_PLUGINS` module). Its class is either a plain
`BaseAgentHandler` (the contract: `invoke`, `astream`, optionally `stream`) or, like chatq's own
adapters, a `PreparedTurnHandler` (`run` on a prepared turn); the worker runs both.

This registry is the one list of frameworks: the worker, the producer API, batch files and the
gateway all read it through `framework_names()` / `framework_choices()`, which first import the
`CHATQ_PLUGINS` modules, so a plugin's framework can be chosen wherever sessions are created.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Sequence
from typing import Any

from chatq.errors import ConfigError
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
from handlers.errors import (
    AgentInvocationError,
    HandlerError,
    InvalidHandler,
    ThreadHopError,
    UnknownFramework,
    UnknownTool,
)
from handlers.handler_settings import process_handler_settings
from handlers.prepared import PreparedTurnHandler

__all__ = [
    "FRAMEWORK_CHOICES",
    "AgentInvocationError",
    "AgentMessage",
    "AgentSession",
    "BaseAgentHandler",
    "HandlerError",
    "InvalidHandler",
    "PreparedTurnHandler",
    "SessionInfo",
    "StreamEvent",
    "StreamEventKind",
    "ThreadHopError",
    "UnknownFramework",
    "UnknownTool",
    "Usage",
    "empty_usage",
    "framework_choices",
    "framework_names",
    "get_agent_handler",
    "load_handler_class",
    "load_plugins",
    "register_framework",
    "unregister_framework",
]

_ADAPTERS: dict[str, tuple[str, str]] = {
    # framework: (label, "module:class" of its BaseAgentHandler, imported on first use)
    "none": ("None", "handlers.single_call.handler:SingleCallHandler"),
    "langgraph": ("LangGraph", "handlers.langgraph.handler:LangGraphHandler"),
    # The worked example of docs/handlers.md: a tool loop on the `openai` SDK, no framework.
    "plain_openai": ("Plain OpenAI SDK", "handlers.plain_openai.handler:PlainOpenAIHandler"),
}

FRAMEWORK_CHOICES: list[tuple[str, str]] = [(name, label) for name, (label, _) in _ADAPTERS.items()]
"""(value, label) of every agent framework a session may use:
`[("none", "None"), ("langgraph", "LangGraph"), ("plain_openai", "Plain OpenAI SDK")]`."""


def register_framework(name: str, label: str, target: str) -> None:
    """Plug in a framework: `target` is "module:Class" of its handler class (a `BaseAgentHandler`
    subclass: a plain handler or a `PreparedTurnHandler`), imported on first use."""
    if not name or name != name.strip() or ":" not in target:
        raise ValueError(f"invalid framework registration {name!r} -> {target!r}")
    if name in _ADAPTERS:
        raise ValueError(f"agent framework {name!r} is already registered")
    _ADAPTERS[name] = (label, target)
    FRAMEWORK_CHOICES.append((name, label))


def unregister_framework(name: str) -> None:
    """Remove a framework (plugins unloading, tests); unknown names are ignored."""
    if _ADAPTERS.pop(name, None) is not None:
        FRAMEWORK_CHOICES[:] = [choice for choice in FRAMEWORK_CHOICES if choice[0] != name]


_plugins_lock = threading.RLock()  # re-entrant: a plugin may read the registry while it is imported


def load_plugins(plugins: Sequence[str] | None = None) -> None:
    """Import the `CHATQ_PLUGINS` modules not imported yet, so what they register exists in this process.

    A worker imports them at start (celeryconfig); producers (the CLI, batch runs, the gateway)
    import them here, the first time they read the registry. Raises ConfigError for a module that
    cannot be imported (missing, or raising as it runs), as the worker would fail to start with it;
    `chatq worker` calls this before it starts any Celery process, with its settings' `plugins`.
    Without `plugins` (the registry's readers, an edge with nothing handed in) this process's are read.
    """
    with _plugins_lock:
        modules = process_handler_settings().plugins if plugins is None else plugins
        for module in modules:
            try:
                importlib.import_module(module)  # a module imported before is not run again
            except Exception as exc:  # anything its code raises: one line, not a traceback
                what = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                reason = what if isinstance(exc, ImportError) else f"{type(exc).__name__}: {what}".rstrip(": ")
                raise ConfigError(f"CHATQ_PLUGINS: cannot import {module!r} ({reason}).") from exc


def framework_choices() -> list[tuple[str, str]]:
    """(value, label) of every registered framework, plugins' included (see `FRAMEWORK_CHOICES`)."""
    load_plugins()
    return list(FRAMEWORK_CHOICES)


def framework_names() -> list[str]:
    """The accepted `agent_framework` values, plugins' included."""
    return [value for value, _ in framework_choices()]


def load_handler_class(framework: str) -> type[BaseAgentHandler]:
    """The handler class of `framework`, importing its adapter on first use.

    A worker can call this at start-up to pay the framework's import cost (about a second for
    LangGraph + langchain-openai) before its first turn. Raises UnknownFramework, and InvalidHandler
    for a class that is not a `BaseAgentHandler` or leaves one of its abstract methods unwritten.
    """
    entry = _ADAPTERS.get(framework)
    if entry is None:
        load_plugins()
        entry = _ADAPTERS.get(framework)
    if entry is None:
        raise UnknownFramework(f"Unknown agent framework {framework!r}; choose one of: {', '.join(framework_names())}.")
    module_name, _, class_name = entry[1].partition(":")
    handler_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(handler_class, type) and issubclass(handler_class, BaseAgentHandler)):
        raise InvalidHandler(f"The handler of agent framework {framework!r} ({entry[1]}) is not a BaseAgentHandler.")
    if inspect.isabstract(handler_class):
        missing = ", ".join(sorted(handler_class.__abstractmethods__))
        raise InvalidHandler(f"The handler of agent framework {framework!r} ({entry[1]}) does not implement {missing}.")
    return handler_class


def get_agent_handler(session: Any) -> BaseAgentHandler:
    """The handler for `session`'s `agent_framework` (an `AgentSession`, e.g. a SessionInfo or the ORM row).

    Raises UnknownFramework for a framework chatq does not know.
    """
    framework = str(getattr(session, "agent_framework", None) or "").strip()
    return load_handler_class(framework)(session)

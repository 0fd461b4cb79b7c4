"""The graph state and the per-invocation context the handler passes to the nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.graph.message import add_messages

from handlers.context import ToolContext
from handlers.deadline import Deadline
from handlers.journal import Journal
from handlers.turn_input import Retrieval

__all__ = ["CONTEXT_KEY", "AgentState", "TurnContext", "context_of"]

CONTEXT_KEY = "chatq_turn"
"""Key of the `TurnContext` in `config["configurable"]`."""


class AgentState(TypedDict):
    """The conversation: history, the user message, then what the agent and tools add."""

    messages: Annotated[Sequence[BaseMessage], add_messages]


@dataclass(frozen=True, kw_only=True)
class TurnContext:
    """What the handler builds once per invocation and every node reuses (never rebuilt per loop).

    One object rather than loose keys: LangChain copies plain str/number configurable values into
    run metadata, and the system prompt does not belong in every trace event.
    """

    llm: Runnable[LanguageModelInput, Any]
    """The chat model with this turn's tools bound."""
    system_prompt: SystemMessage
    """Prepended by the agent node when the conversation does not start with a system message."""
    deadline: Deadline
    """The turn timeout; each model call gets the remaining time."""
    tools: ToolContext
    """What the turn's tools see: session, knowledge bases, turn; set around every tool call."""
    retrieval: Retrieval | None = None
    """The turn's first knowledge-base search, already run; the retrieve node adds it to the conversation."""
    on_text: Callable[[str], None] | None = None
    """Receives the agent's text chunks as they stream (`GraphRun.on_text`); None when nobody listens."""
    on_tool: Callable[[str, str], None] | None = None
    """Told (call id, tool name) right before the tool node runs each call (`GraphRun.on_tool`); None: nobody."""
    journal: Journal | None = None
    """Where the agent node records each reply that calls tools (`handlers.journal`); None: nothing is recorded."""


def context_of(config: RunnableConfig) -> TurnContext:
    """The TurnContext the handler put into the graph config."""
    context = (config.get("configurable") or {}).get(CONTEXT_KEY)
    if not isinstance(context, TurnContext):
        raise RuntimeError(f"the graph must be run with config['configurable'][{CONTEXT_KEY!r}] set")
    return context

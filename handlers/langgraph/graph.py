"""The reactive loop as a LangGraph StateGraph, compiled once per tool set and cached per process.

    START -> agent -(tool calls?)-> tool_execution -> agent ... -(no tool calls)-> END

A session with knowledge bases attached gets a graph whose first step searches them:

    START -> retrieve -> agent -(tool calls?)-> tool_execution -> agent ... -> END

Without it the graph is entered where the conversation stands: at the agent, or at tool execution
when the input ends with an assistant message whose calls are not answered yet (a turn resumed
from its journal, `handlers.journal`, runs the round an earlier attempt left open first).

The compiled graph holds no per-turn state: the model client, system prompt and deadline of a turn
come in through `config["configurable"]`, so one compiled graph serves every turn and thread.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition

from handlers.langgraph.nodes import AGENT_NODE, RETRIEVE_NODE, TOOL_NODE, ToolExecutionNode, agent_node, retrieve_node
from handlers.langgraph.state import AgentState
from handlers.langgraph.tools import langchain_tools

__all__ = ["RECURSION_LIMIT", "build_graph", "get_graph"]

RECURSION_LIMIT = 10
"""Graph steps per invocation (each agent or tool step is one): bounds a model that loops on tools."""

Graph = CompiledStateGraph[AgentState, Any, AgentState, AgentState]


def build_graph(tool_names: Sequence[str], *, retrieve: bool = False) -> Graph:
    """Build and compile the agent graph for these tools (prefer the cached `get_graph`).

    With `retrieve`, a knowledge-base search is the first step of every invocation.
    """
    builder: StateGraph[AgentState, Any, AgentState, AgentState] = StateGraph(AgentState)
    builder.add_node(AGENT_NODE, agent_node)
    builder.add_node(TOOL_NODE, ToolExecutionNode(langchain_tools(tool_names)))
    if retrieve:
        builder.add_node(RETRIEVE_NODE, retrieve_node)
        builder.add_edge(START, RETRIEVE_NODE)
        builder.add_edge(RETRIEVE_NODE, AGENT_NODE)
    else:
        builder.add_conditional_edges(START, tools_condition, {"tools": TOOL_NODE, END: AGENT_NODE})
    # tools_condition answers "tools" when the last AI message has tool calls, else END.
    builder.add_conditional_edges(AGENT_NODE, tools_condition, {"tools": TOOL_NODE, END: END})
    builder.add_edge(TOOL_NODE, AGENT_NODE)
    return builder.compile(name="chatq-agent")


@functools.lru_cache(maxsize=32)
def _cached(tool_names: tuple[str, ...], retrieve: bool) -> Graph:
    return build_graph(tool_names, retrieve=retrieve)


def get_graph(tool_names: Sequence[str], *, retrieve: bool = False) -> Graph:
    """The compiled graph for this tool set (and retrieval step), built on first use in the process and reused after."""
    return _cached(tuple(tool_names), retrieve)

"""The graph LangGraph's own server runs in `make bench-peer` (bench/peer.py): chatq's graph, served.

The same nodes and edges as chatq's agent graph (handlers/langgraph/graph.py: agent node with the
default tools bound <-> chatq's tool node, routed by tools_condition) and the system prompt a new
chatq session gets, so both sides send the model the same requests. The agent node is written as
a LangGraph server user writes it: async, on a stock `ChatOpenAI` (`astream`). A sync node would
run on the server's default thread executor, a handful of threads (cores + 4): 200 turns waiting
10 s on the model then take minutes, which measures the executor rather than the server.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import tools_condition

from handlers.chat_models.turn import collect
from handlers.context import ToolContext
from handlers.deadline import Deadline
from handlers.langgraph.nodes import AGENT_NODE, TOOL_NODE, ToolExecutionNode
from handlers.langgraph.state import CONTEXT_KEY, AgentState, TurnContext
from handlers.langgraph.tools import langchain_tools
from handlers.prompts import build_system_prompt
from handlers.tools import default_tool_names

MODEL = os.environ.get("CHATQ_BENCH_PEER_MODEL", "gpt-4o-mini")
TIMEOUT = 120.0


@functools.lru_cache(maxsize=1)
def _parts() -> tuple[Any, SystemMessage, ToolExecutionNode]:
    tools = default_tool_names()
    model = ChatOpenAI(model=MODEL, stream_usage=True, max_retries=0, timeout=TIMEOUT)
    llm = model.bind_tools(langchain_tools(tools))
    prompt = SystemMessage(content=build_system_prompt(object(), tools=tools))
    return llm, prompt, ToolExecutionNode(langchain_tools(tools))


async def _agent(state: AgentState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
    """chatq's agent node (handlers/langgraph/nodes.py), async: system prompt first, stream, merge."""
    llm, prompt, _ = _parts()
    messages = list(state["messages"])
    if not messages or not isinstance(messages[0], SystemMessage):
        messages.insert(0, prompt)
    chunks = [chunk async for chunk in llm.astream(messages, config) if isinstance(chunk, AIMessageChunk)]
    return {"messages": [collect(chunks)]}


def _tools(state: AgentState, config: RunnableConfig) -> Any:
    """chatq's tool node, with the turn context it reads from the config."""
    llm, prompt, node = _parts()
    context = TurnContext(llm=llm, system_prompt=prompt, deadline=Deadline(TIMEOUT), tools=ToolContext(session_id=None))
    return node(state, {**config, "configurable": {**(config.get("configurable") or {}), CONTEXT_KEY: context}})


def make_graph() -> Any:
    """The server's graph `agent` (langgraph.json names `bench/peer_graph.py:graph`)."""
    builder: StateGraph[AgentState, Any, AgentState, AgentState] = StateGraph(AgentState)
    builder.add_node(AGENT_NODE, _agent)
    builder.add_node(TOOL_NODE, _tools)
    builder.add_edge(START, AGENT_NODE)
    builder.add_conditional_edges(AGENT_NODE, tools_condition, {"tools": TOOL_NODE, END: END})
    builder.add_edge(TOOL_NODE, AGENT_NODE)
    return builder.compile(name="chatq-agent")


graph = make_graph()

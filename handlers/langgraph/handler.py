"""LangGraphHandler: runs a turn through the reactive agent graph and converts its output at the boundary."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphRecursionError

from handlers.base import StreamEvent, StreamEventKind
from handlers.chat_models.messages import content_text, payloads_to_langchain, to_agent_message, usage_from
from handlers.chat_models.models import get_chat_model
from handlers.chat_models.turn import conversation
from handlers.errors import TOO_MANY_STEPS, AgentInvocationError
from handlers.langgraph.graph import RECURSION_LIMIT, get_graph
from handlers.langgraph.nodes import AGENT_NODE, RETRIEVE_NODE, TOOL_NODE
from handlers.langgraph.state import CONTEXT_KEY, TurnContext
from handlers.langgraph.streaming import TEXT, TOOL, GraphRun, run_graph
from handlers.langgraph.tools import langchain_tools
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.turn_input import TurnInput

__all__ = ["TOO_MANY_STEPS", "LangGraphHandler"]

logger = logging.getLogger(__name__)


class LangGraphHandler(PreparedTurnHandler):
    """The `langgraph` framework: agent node with tools bound <-> tool node, until no tool calls remain.

    The prepared turn is the graph's state in (`{"messages": history + user message}`) and its
    per-turn context (model, system prompt, deadline, tool context, the first search); the graph
    itself persists nothing.
    """

    def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
        """Text events as tokens arrive, tool started/finished events; returns the turn's messages and usage."""
        model = get_chat_model(turn.model, turn.endpoint)
        # Built once per invocation and handed to the nodes through the config, never per loop.
        llm = model.bind_tools(langchain_tools(turn.tools)) if turn.tools else model
        graph_run = GraphRun()
        context = TurnContext(
            llm=llm,
            system_prompt=SystemMessage(content=turn.system_prompt),
            deadline=turn.deadline,
            tools=turn.tool_context,
            retrieval=turn.retrieval,
            on_text=graph_run.on_text,
            on_tool=graph_run.on_tool,
            journal=turn.journal,
        )
        config: RunnableConfig = {"recursion_limit": RECURSION_LIMIT, "configurable": {CONTEXT_KEY: context}}
        # With knowledge bases attached, the graph's first step adds the search already run.
        graph = get_graph(turn.tools, retrieve=turn.retrieval is not None)
        # A resumed turn continues after its finished messages; with a round left open the graph is
        # entered at tool execution, whose recorded results come back without running or events.
        resumed = turn.resumed
        state = {"messages": [*conversation(turn), *payloads_to_langchain(m.to_dict() for m in resumed.messages)]}
        produced: list[BaseMessage] = []
        try:
            # Leaving this loop early ends the graph where it waits, unwinding its node (run_graph).
            items = run_graph(graph, state, config, graph_run, turn.deadline)
            yield from _events(items, produced, quiet=resumed.results)
        except GraphRecursionError as exc:
            logger.warning("session %s: recursion limit %d reached", turn.session.id, RECURSION_LIMIT)
            raise AgentInvocationError(TOO_MANY_STEPS) from exc
        return [to_agent_message(m) for m in produced], usage_from(produced)


def _events(
    items: Iterator[tuple[str, Any]], produced: list[BaseMessage], *, quiet: Mapping[str, str] | None = None
) -> Iterator[StreamEvent]:
    """Turn the graph run's text chunks and updates into chatq events; collect new messages.

    Text comes from the agent node's token chunks; the agent's finished messages and the tool
    results come from the updates, which is also where `produced` (this turn's messages, in order)
    is filled. A reply that arrived without token chunks is sent as one text event. A call is
    `started` when the tool node is about to run it (after the round's approval gate, as in
    `plain_openai`: a call that waits for a person is started once, when it runs after the
    decision), the knowledge-base search with its update. A call in `quiet` (its result recorded by
    an earlier attempt, which streamed its events) gets no event.
    """
    streamed = False  # did the current agent step stream any text?
    for kind, data in items:
        if kind == TEXT:
            streamed = True
            yield StreamEvent(kind=StreamEventKind.TEXT, text=data)
            continue
        if kind == TOOL:
            call_id, name = data
            if not (quiet and call_id in quiet):
                yield _tool_event(call_id, name, "started")
            continue
        for node, update in (data or {}).items():
            if node not in (RETRIEVE_NODE, AGENT_NODE, TOOL_NODE) or not update:
                continue
            for message in update.get("messages") or ():
                produced.append(message)
                if isinstance(message, AIMessage):
                    text = content_text(message.content)
                    if text and not streamed:
                        yield StreamEvent(kind=StreamEventKind.TEXT, text=text)
                    streamed = False
                    if node == RETRIEVE_NODE:  # run already, by the turn's preparation
                        for call in message.tool_calls:
                            yield _tool_event(call.get("id"), call["name"], "started")
                elif isinstance(message, ToolMessage) and not (quiet and message.tool_call_id in quiet):
                    yield _tool_event(message.tool_call_id, message.name, "finished")


def _tool_event(call_id: str | None, name: str | None, status: str) -> StreamEvent:
    return StreamEvent(kind=StreamEventKind.TOOL, tool={"id": call_id, "name": name, "status": status})

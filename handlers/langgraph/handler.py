"""LangGraphHandler: runs a turn through the reactive agent graph and converts its output at the boundary."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphRecursionError

from chatq.settings import get_settings
from handlers.base import AgentMessage, BaseAgentHandler, StreamEvent, StreamEventKind, Usage
from handlers.errors import AgentInvocationError, HandlerError
from handlers.knowledge import choose_citations, start_invocation
from handlers.langgraph.graph import RECURSION_LIMIT, get_graph
from handlers.langgraph.nodes import AGENT_NODE, RETRIEVE_NODE, TOOL_NODE
from handlers.langgraph.state import CONTEXT_KEY, TurnContext
from handlers.langgraph.streaming import TEXT, GraphRun, run_graph
from handlers.langgraph.tools import langchain_tools
from handlers.lc.errors import invocation_error
from handlers.lc.messages import content_text, to_agent_message, usage_from
from handlers.lc.models import get_chat_model
from handlers.lc.turn import EMPTY_REPLY, Deadline, astream_from, final_result, is_empty, model_name, prepare_turn
from handlers.tools import session_tool_names

__all__ = ["TOO_MANY_STEPS", "LangGraphHandler"]

logger = logging.getLogger(__name__)

TOO_MANY_STEPS = "The agent stopped: too many tool steps without a final answer."


class LangGraphHandler(BaseAgentHandler):
    """The `langgraph` framework: agent node with tools bound <-> tool node, until no tool calls remain."""

    def tool_names(self, knowledge_bases: Sequence[str] = ()) -> tuple[str, ...]:
        """The session's tools: `metadata["tools"]` when it lists names, else the registry's defaults,
        plus `search_knowledge_base` exactly when knowledge bases are attached.

        Raises UnknownTool (bad input, not retried) when the session names a tool that does not exist.
        """
        return session_tool_names((self.session.metadata_ or {}).get("tools"), knowledge_bases)

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        """The messages produced in this turn (assistant, tool, ..., final assistant) and usage."""
        return final_result(self.stream(user_message, images, reply_to))

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Generator[StreamEvent, None, None]:
        """Text events as tokens arrive, tool started/finished events, then exactly one final event."""
        timeout = get_settings().turn_timeout
        deadline = Deadline(timeout)
        produced: list[BaseMessage] = []
        try:
            invocation = start_invocation(self.session)
            knowledge_bases = invocation.knowledge_bases
            tools = self.tool_names(knowledge_bases)
            turn = prepare_turn(
                self.session, user_message, images, reply_to, tools=tools, knowledge_bases=knowledge_bases
            )
            model = get_chat_model(model_name(self.session))
            # Built once per invocation and handed to the nodes through the config, never per loop.
            llm = model.bind_tools(langchain_tools(tools)) if tools else model
            run = GraphRun()
            context = TurnContext(
                llm=llm, system_prompt=turn.system_prompt, deadline=deadline, tools=invocation, on_text=run.on_text
            )
            config: RunnableConfig = {"recursion_limit": RECURSION_LIMIT, "configurable": {CONTEXT_KEY: context}}
            # With knowledge bases attached, the first step of every question is a search.
            graph = get_graph(tools, retrieve=bool(knowledge_bases))
            # Leaving this loop early ends the graph where it waits, unwinding its node (run_graph).
            yield from _events(run_graph(graph, {"messages": turn.messages}, config, run, deadline), produced)
        except HandlerError:
            # AgentInvocationError as is; any other HandlerError (an unknown tool, a reply_to of another
            # session) is bad input that a retry cannot fix, so it keeps its own type for the worker.
            raise
        except GraphRecursionError as exc:
            logger.warning("session %s: recursion limit %d reached", self.session.id, RECURSION_LIMIT)
            raise AgentInvocationError(TOO_MANY_STEPS) from exc
        except Exception as exc:
            raise invocation_error(exc, timeout=timeout) from exc
        final = produced[-1] if produced else None
        if not isinstance(final, AIMessage) or is_empty(final):
            raise AgentInvocationError(EMPTY_REPLY)
        response = [to_agent_message(m) for m in produced]
        citations = choose_citations(invocation, response[-1].content)
        if citations:
            response[-1] = dataclasses.replace(response[-1], citations=citations)
        yield StreamEvent(kind=StreamEventKind.FINAL, response=response, usage=usage_from(produced))

    def astream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> AsyncGenerator[tuple[str, Usage], None]:
        """(chunk, usage) tuples; usage is `{}` until the last tuple, which carries the totals."""
        return astream_from(lambda: self.stream(user_message, images, reply_to))


def _events(items: Iterator[tuple[str, Any]], produced: list[BaseMessage]) -> Iterator[StreamEvent]:
    """Turn the graph run's text chunks and updates into chatq events; collect new messages.

    Text comes from the agent node's token chunks; the agent's finished messages and the tool
    results come from the updates, which is also where `produced` (this turn's messages, in order)
    is filled. A reply that arrived without token chunks is sent as one text event.
    """
    streamed = False  # did the current agent step stream any text?
    for kind, data in items:
        if kind == TEXT:
            streamed = True
            yield StreamEvent(kind=StreamEventKind.TEXT, text=data)
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
                    for call in message.tool_calls:
                        yield _tool_event(call.get("id"), call["name"], "started")
                elif isinstance(message, ToolMessage):
                    yield _tool_event(message.tool_call_id, message.name, "finished")


def _tool_event(call_id: str | None, name: str | None, status: str) -> StreamEvent:
    return StreamEvent(kind=StreamEventKind.TOOL, tool={"id": call_id, "name": name, "status": status})

"""The graph's nodes: knowledge-base retrieval, the agent (LLM with tools bound) and tool execution.

Routing is tools_condition; the retrieval node only exists in graphs of sessions with knowledge bases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool

from handlers.chat_models.messages import content_text, to_agent_message, usage_from
from handlers.chat_models.turn import collect, stream_model
from handlers.context import use_tool_context
from handlers.errors import HandlerError
from handlers.langgraph.state import AgentState, context_of
from handlers.tools import gate_round, tool_settings, truncate_output

__all__ = ["AGENT_NODE", "RETRIEVE_NODE", "TOOL_NODE", "ToolExecutionNode", "agent_node", "retrieve_node"]

logger = logging.getLogger(__name__)

AGENT_NODE = "agent"
TOOL_NODE = "tool_execution"
RETRIEVE_NODE = "retrieve"


def retrieve_node(state: AgentState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
    """Add the turn's knowledge-base search (run when the turn was prepared) before the model is asked anything.

    The search goes into the conversation as an assistant tool call and its tool result, exactly
    as if the model had called `search_knowledge_base` itself, so the first model request already
    holds the result, the stored turn shows it, and the model may search again with other words.
    """
    context = context_of(config)
    context.deadline.check()
    if context.retrieval is None:
        return {"messages": []}
    call, output = context.retrieval.call, context.retrieval.output
    return {
        "messages": [
            AIMessage(content="", tool_calls=[{"id": call["id"], "name": call["name"], "args": call["args"]}]),
            ToolMessage(
                content=output,
                tool_call_id=call["id"],
                name=call["name"],
                status="error" if output.startswith("Error:") else "success",
            ),
        ]
    }


def agent_node(state: AgentState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
    """Call the prebuilt, tool-bound model on the conversation; the reply may ask for tools.

    The model is streamed (not invoked) so the deadline is checked at every token. Each chunk's
    text goes to `context.on_text` as it arrives; passing `config` on also keeps LangGraph's own
    "messages" stream mode working for anyone who runs the graph with it.
    """
    context = context_of(config)
    messages = list(state["messages"])
    if not messages or not isinstance(messages[0], SystemMessage):
        messages.insert(0, context.system_prompt)
    chunks = stream_model(context.llm, messages, context.deadline, config)
    reply = collect(chunks if context.on_text is None else _tap(chunks, context.on_text))
    if context.journal is not None and reply.tool_calls:
        # Recorded before any of its tools runs: a later attempt of the turn continues from this message.
        context.journal.model_step(to_agent_message(reply), usage_from([reply]))
    return {"messages": [reply]}


def _tap(chunks: Iterator[AIMessageChunk], on_text: Callable[[str], None]) -> Iterator[AIMessageChunk]:
    for chunk in chunks:
        text = content_text(chunk.content)
        if text:
            on_text(text)
        yield chunk


class ToolExecutionNode:
    """Runs every tool call of the last AI message and answers each with a ToolMessage.

    A failing, unknown or mistyped tool never raises: its ToolMessage says `"Error: ..."` so the
    model can recover, and the loop continues.
    """

    def __init__(self, tools: Sequence[BaseTool]) -> None:
        self.by_name = {tool.name: tool for tool in tools}

    def __call__(self, state: AgentState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
        context = context_of(config)
        last = state["messages"][-1]
        calls = last.tool_calls if isinstance(last, AIMessage) else []
        results: list[BaseMessage] = []
        limit = tool_settings(context.tools).max_output_chars
        # Before any call of the round runs: a call that needs a person's approval pauses the round as one.
        gate_round(context.tools, [{"id": c.get("id") or "", "name": c["name"], "args": c.get("args")} for c in calls])
        for call in calls:
            context.deadline.check()
            name, call_id = call["name"], call.get("id") or ""
            if context.on_tool is not None:  # after the gate: a call that waits for a person is not started
                context.on_tool(call_id, name)
            # The registry's tools read their turn (session, knowledge bases, call id) from here.
            with use_tool_context(context.tools.for_call(call_id)):
                output, failed = _run(self.by_name.get(name), name, call.get("args") or {}, config)
            results.append(
                ToolMessage(
                    content=truncate_output(output, limit),
                    tool_call_id=call_id,
                    name=name,
                    status="error" if failed else "success",
                )
            )
        return {"messages": results}


def _run(tool: BaseTool | None, name: str, args: dict[str, Any], config: RunnableConfig) -> tuple[str, bool]:
    if tool is None:
        return f"Error: unknown tool {name!r}. Use only the tools you were given.", True
    try:
        output = tool.invoke(args, config)
    except HandlerError:
        raise  # run_tool's own (an unknown outcome, a step not recorded): the turn's, not the model's to read
    except Exception as exc:
        logger.info("tool %s raised %s", name, type(exc).__name__)
        return f"Error: {str(exc) or type(exc).__name__}", True
    text = output if isinstance(output, str) else str(output)
    return text, text.startswith("Error:")

"""NoneHandler: the `none` framework, a plain streamed model call with no tools.

Same contract as every handler: the shared history and system prompt, the turn timeout, and
AgentInvocationError on timeout, failure or an empty completion.

With knowledge bases attached, the handler searches them itself first (the model cannot call
tools here): the results close the system prompt, the search is reported as a tool event and
recorded like any paid call, and the reply carries its citations.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator, Generator, Sequence

from langchain_core.messages import AIMessageChunk

from chatq.settings import get_settings
from handlers.base import AgentMessage, BaseAgentHandler, StreamEvent, StreamEventKind, Usage
from handlers.errors import AgentInvocationError, HandlerError
from handlers.knowledge import choose_citations, retrieval_step, start_invocation
from handlers.lc.errors import invocation_error
from handlers.lc.messages import content_text, to_agent_message, usage_from
from handlers.lc.models import get_chat_model
from handlers.lc.turn import (
    EMPTY_REPLY,
    Deadline,
    astream_from,
    collect,
    final_result,
    is_empty,
    model_name,
    prepare_turn,
    stream_model,
)

__all__ = ["NoneHandler"]

logger = logging.getLogger(__name__)


class NoneHandler(BaseAgentHandler):
    """Answers each turn with a single model call over the history: no graph, no tools."""

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        """The reply and its usage; raises AgentInvocationError on timeout or failure."""
        return final_result(self.stream(user_message, images, reply_to))

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Generator[StreamEvent, None, None]:
        """Text events as tokens arrive, then one final event."""
        timeout = get_settings().turn_timeout
        deadline = Deadline(timeout)
        chunks: list[AIMessageChunk] = []
        try:
            invocation = start_invocation(self.session)
            results: str | None = None
            if invocation.knowledge_bases:
                call, results = retrieval_step(invocation, user_message)
                yield StreamEvent(kind=StreamEventKind.TOOL, tool={**_tool(call), "status": "started"})
                yield StreamEvent(kind=StreamEventKind.TOOL, tool={**_tool(call), "status": "finished"})
            turn = prepare_turn(
                self.session,
                user_message,
                images,
                reply_to,
                knowledge_bases=invocation.knowledge_bases,
                knowledge_results=results,
            )
            llm = get_chat_model(model_name(self.session))
            for chunk in stream_model(llm, [turn.system_prompt, *turn.messages], deadline):
                chunks.append(chunk)
                if text := content_text(chunk.content):
                    yield StreamEvent(kind=StreamEventKind.TEXT, text=text)
            message = collect(chunks)
        except HandlerError:
            # AgentInvocationError as is; any other HandlerError is bad input (a reply_to of another
            # session, say) that a retry cannot fix, so it keeps its own type for the worker.
            raise
        except Exception as exc:
            raise invocation_error(exc, timeout=timeout) from exc
        if is_empty(message) or message.tool_calls:
            # No tools are bound, so a tool call here means the server ignored that: no usable reply.
            raise AgentInvocationError(EMPTY_REPLY)
        logger.debug("none handler: session %s replied (%d history messages)", self.session.id, len(turn.messages))
        reply = to_agent_message(message)
        citations = choose_citations(invocation, reply.content)
        if citations:
            reply = dataclasses.replace(reply, citations=citations)
        yield StreamEvent(kind=StreamEventKind.FINAL, response=[reply], usage=usage_from([message]))

    def astream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> AsyncGenerator[tuple[str, Usage], None]:
        """(chunk, usage) tuples; usage is `{}` until the last tuple, which carries the totals."""
        return astream_from(lambda: self.stream(user_message, images, reply_to))


def _tool(call: dict[str, object]) -> dict[str, object]:
    return {"id": call["id"], "name": call["name"]}

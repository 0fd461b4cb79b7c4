"""SingleCallHandler: the `none` framework, a plain streamed model call with no tools.

Same contract as every handler: the prepared history and system prompt, the turn timeout, and
AgentInvocationError on timeout, failure or an empty completion.

It calls no tools (`calls_tools = False`), so with knowledge bases attached the prepared first
search closes the system prompt; it is reported as a tool event, and the reply carries its
citations.
"""

from __future__ import annotations

import logging
from collections.abc import Generator

from langchain_core.messages import AIMessageChunk, SystemMessage

from handlers.base import StreamEvent, StreamEventKind
from handlers.chat_models.messages import content_text, to_agent_message, usage_from
from handlers.chat_models.models import get_chat_model
from handlers.chat_models.turn import collect, conversation, stream_model
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.turn_input import TurnInput

__all__ = ["SingleCallHandler"]

logger = logging.getLogger(__name__)


class SingleCallHandler(PreparedTurnHandler):
    """Answers each turn with a single model call over the history: no graph, no tools."""

    calls_tools = False

    def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
        """Text events as tokens arrive; returns the one reply and its usage."""
        if turn.retrieval is not None:
            # The search already ran and closes the system prompt; it is reported like a tool call.
            yield from turn.retrieval.events()
        llm = get_chat_model(turn.model, turn.endpoint)
        messages = [SystemMessage(content=turn.system_prompt), *conversation(turn)]
        chunks: list[AIMessageChunk] = []
        for chunk in stream_model(llm, messages, turn.deadline):
            chunks.append(chunk)
            if text := content_text(chunk.content):
                yield StreamEvent(kind=StreamEventKind.TEXT, text=text)
        # No tools are bound: a tool call in the reply means the server ignored that, and the
        # template refuses it as no answer.
        message = collect(chunks)
        logger.debug("none handler: session %s replied (%d history messages)", turn.session.id, len(turn.history))
        return [to_agent_message(message)], usage_from([message])

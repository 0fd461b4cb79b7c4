"""What every LangChain-based handler does around the model: input, deadline, streaming, async bridge.

Keeping these in one place means the `none` and `langgraph` frameworks build the same history and
prompt, enforce the turn timeout the same way and fail the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.messages.utils import message_chunk_to_message
from langchain_core.runnables import Runnable, RunnableConfig

from chatq.settings import get_settings
from handlers.base import AgentSession
from handlers.deadline import Deadline
from handlers.errors import EMPTY_REPLY, AgentInvocationError
from handlers.history import History, build_history
from handlers.images import model_accepts_images
from handlers.lc.messages import content_text, payloads_to_langchain, user_message
from handlers.prompts import build_system_prompt
from handlers.streaming import astream_from, final_result

__all__ = [
    "EMPTY_REPLY",
    "Deadline",
    "PreparedTurn",
    "astream_from",
    "final_result",
    "model_name",
    "prepare_turn",
    "stream_model",
]

ChatRunnable = Runnable[LanguageModelInput, Any]
"""A chat model, possibly with tools bound (`bind_tools` returns a Runnable, not a model)."""


@dataclass(frozen=True, kw_only=True)
class PreparedTurn:
    """The model input of one invocation."""

    system_prompt: SystemMessage
    """chatq's system prompt for this session (the agent node prepends it)."""
    messages: list[BaseMessage]
    """History, oldest first, then the new user message; no system message."""
    history: History
    """What `build_history` returned (omitted count and summary, for logs)."""


def model_name(session: AgentSession) -> str:
    """The session's model, or this process's default (`CHATQ_MODEL`) when the session names none (NULL)."""
    return get_settings().session_model(session.model)


def prepare_turn(
    session: AgentSession,
    text: str,
    images: Sequence[str] | None,
    reply_to: int | None,
    *,
    tools: Sequence[str] = (),
    knowledge_bases: Sequence[str] = (),
    knowledge_results: str | None = None,
) -> PreparedTurn:
    """History (within the token budget), the system prompt and the user message for one invocation.

    `knowledge_bases` are the session's (the prompt's knowledge-base policy); `knowledge_results`
    is the search already run for this message by a handler that calls no tools.
    """
    history = build_history(session, reply_to, text)
    prompt = build_system_prompt(
        session,
        tools=tools,
        history_summary=history.summary,
        knowledge_bases=knowledge_bases,
        knowledge_results=knowledge_results,
    )
    messages = payloads_to_langchain(history.messages)
    messages.append(user_message(text, images, accepts_images=model_accepts_images(model_name(session))))
    return PreparedTurn(system_prompt=SystemMessage(content=prompt), messages=messages, history=history)


def stream_model(
    llm: ChatRunnable,
    messages: Sequence[BaseMessage],
    deadline: Deadline,
    config: RunnableConfig | None = None,
) -> Iterator[AIMessageChunk]:
    """Stream one model call, bounded by the deadline twice over.

    The remaining time goes to the request as its `timeout` (so a silent server is cut off by the
    HTTP client), and the deadline is checked at every chunk (so a server that trickles tokens
    forever is cut off too). Leaving the loop closes the HTTP response.
    """
    deadline.check()
    for chunk in llm.stream(list(messages), config, timeout=max(deadline.remaining(), 0.01)):
        deadline.check()
        if isinstance(chunk, AIMessageChunk):
            yield chunk


def collect(chunks: Iterable[AIMessageChunk]) -> AIMessage:
    """Merge streamed chunks into the complete AIMessage (text, tool calls and usage)."""
    received = list(chunks)
    if not received:
        raise AgentInvocationError(EMPTY_REPLY)
    # One merge of all chunks: pairwise `+` validates a new message per chunk (5x the CPU at 10 chunks).
    merged = received[0] if len(received) == 1 else add_ai_message_chunks(received[0], *received[1:])
    message = message_chunk_to_message(merged)
    assert isinstance(message, AIMessage)
    return message


def is_empty(message: AIMessage) -> bool:
    """True for a completion with neither text nor tool calls, which chatq treats as a failure."""
    return not content_text(message.content).strip() and not message.tool_calls

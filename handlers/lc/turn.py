"""What every LangChain-based handler does around the model: input, deadline, streaming, async bridge.

Keeping these in one place means the `none` and `langgraph` frameworks build the same history and
prompt, enforce the turn timeout the same way and fail the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.messages.utils import message_chunk_to_message
from langchain_core.runnables import Runnable, RunnableConfig

from handlers.base import AgentMessage, AgentSession, StreamEvent, StreamEventKind, Usage
from handlers.errors import AgentInvocationError
from handlers.history import History, build_history
from handlers.lc.errors import TurnTimeout
from handlers.lc.messages import content_text, payloads_to_langchain, user_message
from handlers.lc.models import model_accepts_images
from handlers.prompts import build_system_prompt
from worker.config import get_settings

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

EMPTY_REPLY = "The model returned an empty reply."

ChatRunnable = Runnable[LanguageModelInput, Any]
"""A chat model, possibly with tools bound (`bind_tools` returns a Runnable, not a model)."""


class Deadline:
    """The turn timeout as a monotonic deadline, checked between streamed events and model calls.

    It also carries a stop flag: a consumer that stops reading (a cancelled turn, a worker shutting
    down) calls `stop()`, and work still running on LangGraph's threads ends at its next check
    instead of streaming on until the timeout.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expires_at = time.monotonic() + seconds
        self._stopped = threading.Event()

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(self.expires_at - time.monotonic(), 0.0)

    def stop(self) -> None:
        """Make every later `check()` fail: nobody is waiting for the result any more."""
        self._stopped.set()

    def check(self) -> None:
        """Raise TurnTimeout once the deadline has passed, AgentInvocationError once stopped."""
        if self._stopped.is_set():
            raise AgentInvocationError("The invocation was stopped.")
        if time.monotonic() >= self.expires_at:
            raise TurnTimeout(f"The model did not answer within the turn timeout ({self.seconds:g} s).")


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
    """The session's model, or the configured default when the session names none."""
    return (session.model or "").strip() or get_settings().default_model


def prepare_turn(
    session: AgentSession,
    text: str,
    images: Sequence[str] | None,
    reply_to: int | None,
    *,
    tools: Sequence[str] = (),
) -> PreparedTurn:
    """History (within the token budget), the system prompt and the user message for one invocation."""
    history = build_history(session, reply_to, text)
    prompt = build_system_prompt(session, tools=tools, history_summary=history.summary)
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
    merged: AIMessageChunk | None = None
    for chunk in chunks:
        merged = chunk if merged is None else merged + chunk
    if merged is None:
        raise AgentInvocationError(EMPTY_REPLY)
    message = message_chunk_to_message(merged)
    assert isinstance(message, AIMessage)
    return message


def is_empty(message: AIMessage) -> bool:
    """True for a completion with neither text nor tool calls, which chatq treats as a failure."""
    return not content_text(message.content).strip() and not message.tool_calls


def final_result(events: Iterable[StreamEvent]) -> tuple[list[AgentMessage], Usage]:
    """Run a handler's `stream()` to its end and return what its final event carries (for `invoke`)."""
    for event in events:
        if event.kind == StreamEventKind.FINAL:
            return list(event.response), dict(event.usage or {})
    raise AgentInvocationError(EMPTY_REPLY)


_DONE = object()


async def astream_from(
    events: Callable[[], Generator[StreamEvent, None, None]],
) -> AsyncGenerator[tuple[str, Usage], None]:
    """Async (chunk, usage) tuples from a sync event stream run on its own thread.

    The whole sync stream runs on one thread (LangChain keeps run context in context variables,
    which must not hop between threads mid-stream); events cross to the event loop through a
    queue. Text chunks come with `{}`; the last tuple is `("", usage)` with the totals.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()

    def put(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody is listening
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            with contextlib.closing(events()) as iterator:
                for event in iterator:
                    put(event)
                    if stop.is_set():
                        return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(exc)
        else:
            put(_DONE)

    threading.Thread(target=pump, name="chatq-astream", daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            if item.kind == StreamEventKind.TEXT and item.text:
                yield item.text, {}
            elif item.kind == StreamEventKind.FINAL:
                yield "", dict(item.usage or {})
    finally:
        stop.set()

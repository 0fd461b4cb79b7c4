"""The framework-agnostic agent contract: the handler interface every agent handler implements.

`BaseAgentHandler` is the contract chatq was built from, unchanged: a handler is made with the
session it serves and implements `invoke` (messages and usage) and `astream` ((chunk, usage)
tuples); `stream` (events as they happen, then one final event) is optional, and callers fall back
to `invoke` when it raises NotImplementedError. A handler written to it registers as it is
(`handlers.register_framework`), and the worker runs it (`handlers.plain`).

chatq's own adapters derive from `handlers.prepared.PreparedTurnHandler`, which implements all
three on one method, `run(turn)`, fed a turn prepared once for every framework. The
boundary types (`AgentMessage`, `StreamEvent`, ...) live in `handlers.messages` and are
re-exported from this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Iterator, Sequence

from handlers.errors import AgentInvocationError
from handlers.messages import (
    AgentMessage,
    AgentSession,
    SessionInfo,
    StreamEvent,
    StreamEventKind,
    ToolCall,
    Usage,
    empty_usage,
)

__all__ = [
    "AgentInvocationError",
    "AgentMessage",
    "AgentSession",
    "BaseAgentHandler",
    "SessionInfo",
    "StreamEvent",
    "StreamEventKind",
    "ToolCall",
    "Usage",
    "empty_usage",
]


class BaseAgentHandler(ABC):
    """The abstract base class all handlers implement: `invoke` and `astream`; `stream` optionally.

    `session` is the chat session the handler serves (`id`, `agent_framework`, `model`,
    `system_prompt`, `metadata_`; in the worker a `SessionInfo`). `images` are the image references
    sent with the message (URLs or data: URLs); `reply_to` is the id of the stored user message
    being answered again (regenerate/edit): history is taken from before it.
    """

    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @abstractmethod
    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        """Synchronous invocation. Returns (messages, usage) with usage keys prompt_tokens,
        completion_tokens and total_tokens.

        Raises AgentInvocationError on timeout or failure, never an empty result.
        """

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Iterator[StreamEvent]:
        """Yield "text" and "tool" events as they happen, then one "final" event whose `response`
        is what `invoke` returns first (the messages) and `usage` its usage.

        Optional: callers catch NotImplementedError and fall back to `invoke`.
        """
        raise NotImplementedError

    @abstractmethod
    async def astream(self, user_message: str) -> AsyncGenerator[tuple[str, Usage], None]:
        """Async streaming. Yields (chunk, usage) tuples."""
        raise NotImplementedError
        yield  # an async generator, as an implementation written with `yield` is

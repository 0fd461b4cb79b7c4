"""The framework-agnostic agent contract: the handler interface every framework implements.

An adapter writes one method, `stream(turn)`: the turn arrives prepared (`handlers.turn_input`),
and `invoke` / `astream` are built on `stream` here. The boundary types (`AgentMessage`,
`StreamEvent`, ...) live in `handlers.messages` and are re-exported from this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

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
from handlers.streaming import astream_from, final_result

if TYPE_CHECKING:
    from handlers.turn_input import TurnInput

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
    """The contract every agent framework adapter implements: `stream(turn)`, nothing else.

    The turn arrives prepared (`handlers.turn_input.TurnInput`: history, system prompt, tools, the
    first knowledge-base search, deadline); `invoke` and `astream` are built on `stream` here.
    """

    calls_tools: ClassVar[bool] = True
    """False for a framework whose model calls no tools (`none`): its turns bind none, and a
    knowledge-base search closes the system prompt instead of entering the conversation."""

    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @abstractmethod
    def stream(self, turn: TurnInput) -> Iterator[StreamEvent]:
        """Run the agent on `turn`: yield "text" and "tool" events as they happen, then exactly one "final"
        event whose `response` is the list of `AgentMessage` the turn produced and `usage` its tokens.

        Raises AgentInvocationError on timeout or failure, never an empty result.
        """

    def prepare(self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None) -> TurnInput:
        """The input of one invocation on this handler's session (what the worker builds before `stream`)."""
        # Imported on first use: preparing reads Postgres, which `import handlers` must not need.
        from handlers.turn_input import build_turn_input

        return build_turn_input(
            self.session, user_message, images=images, reply_to=reply_to, calls_tools=self.calls_tools
        )

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        """Prepare and stream one invocation to its end: (messages, usage), as the final event carries them."""
        return final_result(self.stream(self.prepare(user_message, images, reply_to)))

    def astream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> AsyncGenerator[tuple[str, Usage], None]:
        """Async (chunk, usage) tuples; usage is `{}` until the last one, which carries the totals.

        The whole invocation (preparing included) runs on one thread of its own, for async consumers
        that would otherwise advance `stream` on several threads.
        """
        return astream_from(lambda: self.stream(self.prepare(user_message, images, reply_to)))

"""`PreparedTurnHandler`: the base of chatq's own adapters, which write one method, `stream_turn(turn)`.

The turn arrives prepared (`handlers.turn_input.TurnInput`: history, system prompt, tools, the
first knowledge-base search, deadline), so an adapter only runs its agent. The contract's
`invoke`, `stream` and `astream` (`handlers.base.BaseAgentHandler`) are built on `stream_turn`
here, so every adapter is also an ordinary handler to any caller of that contract. The worker
prepares the turn itself and calls `stream_turn` (`worker/runtime/relay.py`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from handlers.base import BaseAgentHandler
from handlers.messages import AgentMessage, StreamEvent, Usage
from handlers.streaming import astream_from, final_result

if TYPE_CHECKING:
    from handlers.turn_input import TurnInput

__all__ = ["PreparedTurnHandler"]


class PreparedTurnHandler(BaseAgentHandler):
    """A handler that implements `stream_turn(turn)`, nothing else; `invoke`, `stream` and `astream` follow."""

    calls_tools: ClassVar[bool] = True
    """False for a framework whose model calls no tools (`none`): its turns bind none, and a
    knowledge-base search closes the system prompt instead of entering the conversation."""

    @abstractmethod
    def stream_turn(self, turn: TurnInput) -> Iterator[StreamEvent]:
        """Run the agent on `turn`: yield "text" and "tool" events as they happen, then exactly one "final"
        event whose `response` is the list of `AgentMessage` the turn produced and `usage` its tokens.

        Raises AgentInvocationError on timeout or failure, never an empty result.
        """

    def prepare(self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None) -> TurnInput:
        """The input of one invocation on this handler's session (what the worker builds before `stream_turn`),
        from the default store (`handlers.store`); the worker hands in its own."""
        # Imported on first use: `import handlers` must not need the store.
        from handlers.turn_input import build_turn_input

        return build_turn_input(
            self.session, user_message, images=images, reply_to=reply_to, calls_tools=self.calls_tools
        )

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Iterator[StreamEvent]:
        """Prepare one invocation and stream it: text and tool events, then one final event."""
        return self.stream_turn(self.prepare(user_message, images, reply_to))

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        """Prepare and stream one invocation to its end: (messages, usage), as the final event carries them."""
        return final_result(self.stream(user_message, images, reply_to))

    def astream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> AsyncGenerator[tuple[str, Usage], None]:
        """Async (chunk, usage) tuples; usage is `{}` until the last one, which carries the totals.

        The whole invocation (preparing included) runs on one thread of its own, for async consumers
        that would otherwise advance `stream_turn` on several threads.
        """
        return astream_from(lambda: self.stream(user_message, images, reply_to))

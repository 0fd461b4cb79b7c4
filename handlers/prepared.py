"""`PreparedTurnHandler`: the base of chatq's own adapters, which write one method, `run(turn)`.

The turn arrives prepared (`handlers.turn_input.TurnInput`: history, system prompt, tools, the
first knowledge-base search, deadline), so an adapter only runs its agent: `run` yields text and
tool events and returns the messages and usage. Everything around the run is the same for every
framework and is done once, here, by `stream_turn` (the template the worker calls, never
overridden): failures mapped to one user-visible line, an empty reply refused, the one final event
emitted (with the citations). The contract's `invoke`, `stream` and `astream`
(`handlers.base.BaseAgentHandler`) are built on `stream_turn`, so every adapter is also an ordinary
handler to any caller of that contract.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, final

from handlers.base import BaseAgentHandler
from handlers.errors import EMPTY_REPLY, AgentInvocationError, HandlerError
from handlers.messages import AgentMessage, StreamEvent, Usage
from handlers.streaming import astream_from, final_result

if TYPE_CHECKING:
    from handlers.turn_input import TurnInput

__all__ = ["PreparedTurnHandler", "Reply", "is_answer"]

Reply = tuple[list[AgentMessage], Usage]
"""What an adapter's `run` returns: the messages the turn produced, in order, and its token usage."""


class PreparedTurnHandler(BaseAgentHandler):
    """A handler that implements `run(turn)`, nothing else; `stream_turn`, `invoke`, `stream` and `astream` follow."""

    calls_tools: ClassVar[bool] = True
    """False for a framework whose model calls no tools (`none`): its turns bind none, and a
    knowledge-base search closes the system prompt instead of entering the conversation."""

    @abstractmethod
    def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
        """Run the agent on `turn`: yield "text" and "tool" events as they happen, then return
        (messages, usage): every `AgentMessage` the turn produced, in order, and its tokens.

        Raise AgentInvocationError for a failure of the agent's own (too many steps, say); any other
        exception is mapped by `stream_turn`. Do not check for an empty reply or build the final event.
        """

    @final
    def stream_turn(self, turn: TurnInput) -> Iterator[StreamEvent]:
        """The run's events, then exactly one "final" event: the template every adapter runs in.

        A HandlerError passes as it is (an AgentInvocationError is retried once, any other is bad
        input). A database or configuration error is raised unchanged (an outage, or a retry that
        would fail the same way); anything else becomes one user-visible AgentInvocationError line
        (`handlers.chat_models.errors.invocation_error`: the openai SDK's errors by kind, a busy
        service as `ProviderBusy`, a stopped request as stopped). A reply whose last message is not
        an assistant answer with text (`is_answer`) is refused as empty.

        A resumed turn (`turn.resumed`): the finished messages and their usage go in front of what
        `run` returned, so the reply is what an uninterrupted run returns (each message once, in order).
        """
        try:
            messages, usage = yield from self.run(turn)
            if turn.resumed.steps:
                messages = [*turn.resumed.messages, *messages]
                earlier = turn.resumed.usage
                usage = {key: int(earlier.get(key, 0)) + int(usage.get(key, 0)) for key in {**earlier, **usage}}
        except HandlerError:
            raise
        except Exception as exc:
            # Imported on failure only: the one mapping knows the openai SDK's exception types
            # (langchain-openai raises them too), which a shared module does not import up front.
            from handlers.chat_models.errors import invocation_error

            raise invocation_error(exc, timeout=turn.timeout) from exc
        if not is_answer(messages):
            raise AgentInvocationError(EMPTY_REPLY)
        yield turn.final_event(messages, usage)

    def prepare(self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None) -> TurnInput:
        """The input of one invocation on this handler's session (what the worker builds before `stream_turn`),
        from the default store (`handlers.store`) and this process's settings; the worker hands in its own.

        The entry of a handler called without a worker (`invoke`, `stream`, `astream`): the settings are
        read here, once per invocation, and handed down (`handlers.handler_settings`).
        """
        # Imported on first use: `import handlers` must not need the store.
        from handlers.handler_settings import process_handler_settings
        from handlers.turn_input import build_turn_input

        return build_turn_input(
            self.session,
            user_message,
            images=images,
            reply_to=reply_to,
            calls_tools=self.calls_tools,
            settings=process_handler_settings(),
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


def is_answer(messages: Sequence[AgentMessage]) -> bool:
    """True when a turn's messages end in an answer: an assistant message with text and no tool calls.

    Anything else (no messages, a blank completion, a tool call left unanswered, a tool result
    last) is the empty reply chatq treats as the agent's failure, whatever the framework.
    """
    last = messages[-1] if messages else None
    return last is not None and last.role == "assistant" and bool(last.content.strip()) and not last.tool_calls

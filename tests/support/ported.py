"""A plugin (CHATQ_PLUGINS=tests.support.ported): handlers written to the plain contract, as ported.

Two frameworks, registered when chatq imports this module as it imports any CHATQ_PLUGINS module:

- `ported_invoke`: `PortedInvokeHandler` implements only what the contract requires, `invoke` and
  `astream`; the worker gets its reply from `invoke` as one final event.
- `ported_stream`: `PortedStreamHandler` also implements the optional `stream`: text events, a
  tool call (started, finished), then one final event.

Neither calls a model, nor receives anything chatq prepared: they get the message as sent and
read the history themselves: the store's rows (`models.history.session_history(session, reply_to)`)
cut to the budget by `handlers.history.trim_history(pages, prompt)`.
The reply says what they received, so a test can tell that it reached them. Directives in the
message: `[fail]` raises AgentInvocationError (after the first word when streaming), `[crash]`
raises RuntimeError, `[sleep: S]` blocks S seconds first.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, Iterator, Sequence

from handlers import register_framework
from handlers.base import AgentInvocationError, AgentMessage, BaseAgentHandler, StreamEvent
from handlers.history import trim_history
from handlers.tokens import count_tokens
from models.history import session_history

INVOKE_FRAMEWORK = "ported_invoke"
STREAM_FRAMEWORK = "ported_stream"
FAILURE = "The ported agent failed."
TOOL_CALL = {"id": "call-lookup-1", "name": "lookup", "args": {"q": "weather"}}
TOOL_OUTPUT = "sunny"
_SLEEP = re.compile(r"\[sleep:\s*([0-9.]+)\]")


def answer(session: object, user_message: str, images: Sequence[str] | None, reply_to: int | None) -> str:
    """The reply: what the handler received, and how much history it found before `reply_to`."""
    with session_history(session, reply_to) as pages:
        history = trim_history(pages, user_message)
    framework = getattr(session, "agent_framework", "?")
    return (
        f"{user_message} | {framework} | history {len(history.messages)} | "
        f"images {len(images or ())} | reply_to {reply_to}"
    )


def _act(user_message: str) -> None:
    if match := _SLEEP.search(user_message):
        time.sleep(float(match.group(1)))
    if "[crash]" in user_message:
        raise RuntimeError("ported handler bug")


def _usage(prompt: str, reply: str) -> dict[str, int]:
    prompt_tokens, completion_tokens = count_tokens(prompt), count_tokens(reply)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class PortedInvokeHandler(BaseAgentHandler):
    """The contract's two required methods, nothing chatq-specific."""

    def invoke(self, user_message: str, images=None, reply_to=None):  # as the contract writes it
        _act(user_message)
        if "[fail]" in user_message:
            raise AgentInvocationError(FAILURE)
        reply = answer(self.session, user_message, images, reply_to)
        return [AgentMessage(role="assistant", content=reply)], _usage(user_message, reply)

    async def astream(self, user_message: str) -> AsyncGenerator[tuple[str, dict[str, int]], None]:
        messages, usage = self.invoke(user_message)
        for word in messages[-1].content.split(" "):
            yield f"{word} ", {}
        yield "", usage


class PortedStreamHandler(PortedInvokeHandler):
    """Also the optional `stream`: words as text events, one tool call, then the final event."""

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Iterator[StreamEvent]:
        _act(user_message)
        reply = answer(self.session, user_message, images, reply_to)
        yield StreamEvent(kind="tool", tool={"id": TOOL_CALL["id"], "name": TOOL_CALL["name"], "status": "started"})
        yield StreamEvent(kind="tool", tool={"id": TOOL_CALL["id"], "name": TOOL_CALL["name"], "status": "finished"})
        words = reply.split(" ")
        for index, word in enumerate(words):
            if index == 1 and "[fail]" in user_message:
                raise AgentInvocationError(FAILURE)
            yield StreamEvent(kind="text", text=word if index == len(words) - 1 else f"{word} ")
        messages = [
            AgentMessage(role="assistant", content="", tool_calls=[TOOL_CALL]),
            AgentMessage(role="tool", content=TOOL_OUTPUT, tool_call_id=TOOL_CALL["id"]),
            AgentMessage(role="assistant", content=reply),
        ]
        yield StreamEvent(kind="final", response=messages, usage=_usage(user_message, reply))


register_framework(INVOKE_FRAMEWORK, "Ported, invoke only (test plugin)", f"{__name__}:PortedInvokeHandler")
register_framework(STREAM_FRAMEWORK, "Ported, streaming (test plugin)", f"{__name__}:PortedStreamHandler")

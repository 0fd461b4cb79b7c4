"""A plugin framework (CHATQ_PLUGINS=tests.support.stream_only): an adapter that writes only `run`.

Importing the module registers the framework `stream_only`, as any CHATQ_PLUGINS module would, so
tests never import it themselves: `tests.support.handlers.plugin_installed` names it in
CHATQ_PLUGINS and lets chatq import it, as a worker or producer process would. The adapter calls
no model: its reply states what the prepared turn held (the user's message, how many
history messages, the system prompt's first line), so a test can tell that the input reached it.
"""

from __future__ import annotations

from collections.abc import Generator

from handlers import register_framework
from handlers.base import AgentMessage, StreamEvent, StreamEventKind
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.tokens import count_tokens
from handlers.turn_input import TurnInput

FRAMEWORK = "stream_only"
LABEL = "Stream only (test plugin)"


def reply_to(turn: TurnInput) -> str:
    """What the adapter answers for `turn`."""
    first_line = turn.system_prompt.splitlines()[0]
    return f"{turn.user_message} | history {len(turn.history)} | prompt {first_line}"


class StreamOnlyHandler(PreparedTurnHandler):
    """The whole adapter: one method."""

    def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
        reply = reply_to(turn)
        for word in reply.split(" "):
            turn.deadline.check()
            yield StreamEvent(kind=StreamEventKind.TEXT, text=f"{word} ")
        prompt, completion = count_tokens(turn.system_prompt + turn.user_message), count_tokens(reply)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return [AgentMessage(role="assistant", content=reply)], usage


register_framework(FRAMEWORK, LABEL, f"{__name__}:StreamOnlyHandler")

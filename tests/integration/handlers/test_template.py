"""`PreparedTurnHandler.stream_turn`: the one template every adapter's `run` goes through.

Whatever the framework, the same failures come out the same way: an empty reply is refused with
`EMPTY_REPLY`, an exception of the run is one user-visible line, and a reply gets exactly one final
event. The adapters here write only `run`, as chatq's own do; the real frameworks run against the
OpenAI stub.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import pytest

from chatq.errors import ConfigError
from handlers import AgentInvocationError, framework_names, get_agent_handler
from handlers.base import AgentMessage, SessionInfo, StreamEvent, StreamEventKind
from handlers.errors import EMPTY_REPLY, TurnTimeout, UnknownTool
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.turn_input import TurnInput
from tests.support.handlers import stream_turn
from tests.support.openai_stub import OpenAIStub

MakeSession = Callable[..., SessionInfo]
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
TEXT = StreamEvent(kind=StreamEventKind.TEXT, text="partial ")
CALL = {"id": "c1", "name": "calculator", "args": {"expression": "1+1"}}


def adapter(reply: Reply | BaseException) -> type[PreparedTurnHandler]:
    """An adapter whose run streams one text event, then returns `reply` (or raises it)."""

    class Adapter(PreparedTurnHandler):
        def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
            yield TEXT
            if isinstance(reply, BaseException):
                raise reply
            return reply

    return Adapter


EMPTY_REPLIES = {
    "no messages": ([], USAGE),
    "blank text": ([AgentMessage(role="assistant", content=" \n")], USAGE),
    "a tool call last": ([AgentMessage(role="assistant", content="let me see", tool_calls=[CALL])], USAGE),
    "a tool result last": (
        [
            AgentMessage(role="assistant", content="", tool_calls=[CALL]),
            AgentMessage(role="tool", content="2", tool_call_id="c1"),
        ],
        USAGE,
    ),
}


@pytest.mark.parametrize("reply", EMPTY_REPLIES.values(), ids=EMPTY_REPLIES.keys())
def test_an_empty_reply_is_refused_by_the_template_after_the_runs_events(
    reply: Reply, make_session: MakeSession
) -> None:
    handler = adapter(reply)(make_session(framework="langgraph", model="echo"))
    seen: list[StreamEvent] = []
    with pytest.raises(AgentInvocationError) as raised:
        seen.extend(stream_turn(handler, "hello"))
    assert raised.value.message == EMPTY_REPLY
    assert seen == [TEXT]  # the run's events went out; no final event


def test_every_framework_refuses_an_empty_completion_with_the_same_line(
    stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    lines = set()
    for framework in framework_names():
        with pytest.raises(AgentInvocationError) as raised:
            get_agent_handler(make_session(framework=framework)).invoke("[empty]")
        lines.add(raised.value.message)
    assert lines == {EMPTY_REPLY}


def test_a_reply_gets_exactly_one_final_event_with_the_runs_messages_and_usage(make_session: MakeSession) -> None:
    answer = AgentMessage(role="assistant", content="the answer")
    handler = adapter(([answer], USAGE))(make_session(framework="langgraph", model="echo"))
    events = list(stream_turn(handler, "hello"))
    assert events[0] == TEXT and [e.kind for e in events] == ["text", "final"]
    assert events[-1].response == [answer] and events[-1].usage == USAGE
    assert handler.invoke("hello") == ([answer], USAGE)


def test_the_template_maps_what_the_run_raises(make_session: MakeSession) -> None:
    session = make_session(framework="langgraph", model="echo")
    with pytest.raises(AgentInvocationError) as failed:
        list(stream_turn(adapter(RuntimeError("secret detail"))(session), "hello"))
    assert failed.value.message == "The agent failed (RuntimeError)." and "secret" not in str(failed.value)
    with pytest.raises(TurnTimeout, match=r"turn timeout \("):
        list(stream_turn(adapter(TimeoutError())(session), "hello"))
    # A HandlerError (bad input) and a configuration error pass unchanged: neither is retried.
    bad_input = UnknownTool("no tool 'x'")
    with pytest.raises(UnknownTool) as passed:
        list(stream_turn(adapter(bad_input)(session), "hello"))
    assert passed.value is bad_input
    with pytest.raises(ConfigError):
        list(stream_turn(adapter(ConfigError("no key"))(session), "hello"))

"""The `none` framework: one plain model call, streamed; same history, prompt and failure contract."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from handlers import AgentInvocationError, AgentMessage, get_agent_handler
from handlers.base import SessionInfo, Usage
from handlers.single_call.handler import SingleCallHandler
from tests.support.env import environ
from tests.support.handlers import stream_turn
from tests.support.openai_stub import OpenAIStub

MakeSession = Callable[..., SessionInfo]


def test_none_streams_a_plain_reply(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(framework="none", system_prompt="Be terse."))
    assert isinstance(handler, SingleCallHandler)
    events = list(stream_turn(handler, "hello none [words: 4]"))
    assert [e.kind for e in events].count("text") >= 4
    assert "".join(e.text for e in events if e.kind == "text") == "w1 w2 w3 w4"
    final = events[-1]
    assert final.kind == "final"
    assert final.response == [AgentMessage(role="assistant", content="w1 w2 w3 w4")]
    assert final.usage == stub_env.replies[0]["usage"]
    request = stub_env.requests[0]
    assert "tools" not in request
    assert request["messages"][0]["role"] == "system" and request["messages"][0]["content"].startswith("Be terse.")


def test_none_invoke(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    messages, usage = get_agent_handler(make_session(framework="none")).invoke("hi")
    assert messages == [AgentMessage(role="assistant", content="You said: hi")]
    assert usage["total_tokens"] > 0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("x [fail]", "HTTP 500"), ("x [empty]", "empty reply")],
)
def test_none_failures(stub_env: OpenAIStub, make_session: MakeSession, text: str, fragment: str) -> None:
    with pytest.raises(AgentInvocationError, match=fragment):
        get_agent_handler(make_session(framework="none")).invoke(text)


def test_none_timeout(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(framework="none"))
    with environ(CHATQ_TURN_TIMEOUT="0.5"):
        started = time.monotonic()
        with pytest.raises(AgentInvocationError, match="turn timeout"):
            handler.invoke("[sleep: 5]")
    assert time.monotonic() - started < 1.5


def test_none_echo_offline(make_session: MakeSession) -> None:
    with environ(OPENAI_BASE_URL="", OPENAI_API_KEY=""):
        handler = get_agent_handler(make_session(framework="none", model="echo"))
        messages, usage = handler.invoke("ping pong")

        async def collect() -> list[tuple[str, Usage]]:
            return [item async for item in handler.astream("ping pong")]

        items = asyncio.run(collect())
    assert messages == [AgentMessage(role="assistant", content="ping pong")]
    assert usage["completion_tokens"] > 0
    assert "".join(t for t, _ in items) == "ping pong" and items[-1][1] == usage

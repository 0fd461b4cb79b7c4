"""The handler contract (handlers/base.py), run against every registered framework.

A new framework registered in `handlers._ADAPTERS` is tested here without a line of new test code:
real handlers over HTTP to the OpenAI stub, real Postgres history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from chatq.errors import ConfigError
from handlers import AgentInvocationError, AgentMessage, BaseAgentHandler, framework_names, get_agent_handler
from handlers.base import SessionInfo, Usage
from tests.support.env import environ
from tests.support.factories import add_turn, assistant, user
from tests.support.handlers import stream_turn
from tests.support.openai_stub import OpenAIStub

MakeSession = Callable[..., SessionInfo]
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}

pytestmark = pytest.mark.parametrize("framework", framework_names())


def _check_usage(usage: Usage) -> None:
    assert set(usage) == USAGE_KEYS
    assert all(isinstance(v, int) for v in usage.values())
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_is_a_base_agent_handler(framework: str, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(framework=framework))
    assert isinstance(handler, BaseAgentHandler)


def test_invoke_returns_agent_messages_and_usage(
    framework: str, stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    messages, usage = get_agent_handler(make_session(framework=framework)).invoke("hello contract")
    assert messages and all(isinstance(m, AgentMessage) for m in messages)
    assert messages[-1] == AgentMessage(role="assistant", content="You said: hello contract")
    _check_usage(usage)
    replies = stub_env.replies
    assert usage["total_tokens"] == sum(r["usage"]["total_tokens"] for r in replies)


def test_stream_yields_text_then_exactly_one_final_like_invoke(
    framework: str, stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    handler = get_agent_handler(make_session(framework=framework))
    events = list(stream_turn(handler, "[words: 6]"))
    kinds = [e.kind for e in events]
    assert kinds[-1] == "final" and kinds.count("final") == 1
    assert set(kinds[:-1]) == {"text"}
    texts = [e.text for e in events[:-1]]
    assert len(texts) >= 6  # streamed as it came, not in one piece
    final = events[-1]
    assert "".join(texts) == final.response[-1].content == "w1 w2 w3 w4 w5 w6"
    _check_usage(final.usage or {})
    messages, usage = handler.invoke("[words: 6]")
    assert messages == final.response
    assert set(usage) == set(final.usage or {})


def test_astream_yields_chunks_then_usage(framework: str, stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(framework=framework))

    async def collect() -> list[tuple[str, Usage]]:
        return [item async for item in handler.astream("[words: 3]")]

    items = asyncio.run(collect())
    assert "".join(chunk for chunk, _ in items) == "w1 w2 w3"
    assert all(usage == {} for _, usage in items[:-1])
    _check_usage(items[-1][1])


def test_model_failure_raises_agent_invocation_error(
    framework: str, stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    with pytest.raises(AgentInvocationError) as info:
        get_agent_handler(make_session(framework=framework)).invoke("boom [fail]")
    assert info.value.message == "The model service returned an error (HTTP 500)."


def test_empty_completion_raises_agent_invocation_error(
    framework: str, stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    with pytest.raises(AgentInvocationError, match="empty reply"):
        get_agent_handler(make_session(framework=framework)).invoke("[empty]")


def test_timeout_raises_agent_invocation_error(framework: str, stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(framework=framework))
    with environ(CHATQ_TURN_TIMEOUT="1"):
        started = time.monotonic()
        with pytest.raises(AgentInvocationError, match="turn timeout"):
            handler.invoke("hello [sleep: 5]")
        assert time.monotonic() - started < 2.5
        with pytest.raises(AgentInvocationError, match="turn timeout"):
            list(stream_turn(handler, "[words: 50] [slow: 0.1]"))
        assert time.monotonic() - started < 5


def test_history_and_system_prompt_are_the_shared_ones(
    framework: str, stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    session = make_session(framework=framework, system_prompt="Be terse.")
    add_turn(session.id, [user("my name is Ada"), assistant("Hello Ada")])
    get_agent_handler(session).invoke("what is my name?")
    sent = stub_env.requests[0]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].startswith("Be terse.")
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "my name is Ada"),
        ("assistant", "Hello Ada"),
        ("user", "what is my name?"),
    ]


def test_tools_run_through_the_shared_registry(framework: str, stub_env: OpenAIStub, make_session: MakeSession) -> None:
    if framework == "none":
        pytest.skip("the none framework calls no tools")
    messages, usage = get_agent_handler(make_session(framework=framework)).invoke("six times seven [calc: 6*7]")
    call, result, answer = messages
    assert call.tool_calls is not None and call.tool_calls[0]["name"] == "calculator"
    assert result == AgentMessage(role="tool", content="42", tool_call_id=call.tool_calls[0]["id"])
    assert answer == AgentMessage(role="assistant", content="The answer is 42.")
    assert {t["function"]["name"] for t in stub_env.requests[0]["tools"]} == {"calculator", "current_time"}
    _check_usage(usage)


def test_a_real_model_without_key_or_url_is_a_configuration_error(framework: str, make_session: MakeSession) -> None:
    """Not an AgentInvocationError: the worker fails such a turn at once instead of retrying it."""
    session = make_session(framework=framework, model="gpt-4o-mini")
    with environ(OPENAI_BASE_URL="", OPENAI_API_KEY=""), pytest.raises(ConfigError) as raised:
        get_agent_handler(session).invoke("hi")
    assert not isinstance(raised.value, AgentInvocationError)
    assert raised.value.message == (
        "Model 'gpt-4o-mini' needs OPENAI_API_KEY or OPENAI_BASE_URL; use the 'echo' model to run offline."
    )


def test_the_offline_echo_model_needs_no_server(framework: str, make_session: MakeSession) -> None:
    with environ(OPENAI_BASE_URL="", OPENAI_API_KEY=""):
        messages, usage = get_agent_handler(make_session(framework=framework, model="echo")).invoke("offline please")
    assert messages == [AgentMessage(role="assistant", content="offline please")]
    _check_usage(usage)

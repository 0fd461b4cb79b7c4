"""Text a model returns that no UTF-8 encoder takes (a lone surrogate from a `\\ud800` escape) in
a tool call's arguments: the turn succeeds with it made U+FFFD, as README promises, in every
framework that runs tools. Run in this process against the real Postgres, Redis and model stub.

It once failed the LangGraph turn: the tool call went back to the model in the next request and
the HTTP client could not encode it, so the agent failed, was retried and failed again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from chatq.settings import get_settings, reset_settings
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.payload import INTERACTIVE_QUEUE, parse_turn_request
from worker.producer import create_session
from worker.runtime.delivery.runner import Outcome, execute_turn


@pytest.fixture
def runtime(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """Settings of a worker that talks to the stub (no retry delay, so nothing waits)."""
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


@pytest.mark.parametrize("framework", ["langgraph", "plain_openai"])
def test_a_lone_surrogate_in_tool_call_arguments_is_cleaned_and_the_turn_succeeds(
    runtime: OpenAIStub, redis_url: str, framework: str
) -> None:
    key = uuid.uuid4().hex
    session_id = create_session(framework=framework, model="gpt-4o-mini")
    # The stub's tool call carries the JSON escape \ud800: parsed, a lone surrogate.
    content = f'what time [tool: current_time {{"timezone": "Europe/Paris\\ud800"}}] {key}'
    request = parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
    )
    result = execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())
    assert result.outcome is Outcome.SUCCEEDED, result
    assert result.attempt == 1
    messages = turn_messages(request.turn_id)
    call = next(m for m in messages if m.tool_calls)
    assert call.tool_calls[0]["args"] == {"timezone": "Europe/Paris\ufffd"}
    assert messages[-1].role == "assistant" and messages[-1].content.startswith("The answer is")
    requests = [body for body in runtime.requests if key in json.dumps(body)]
    assert len(requests) == 2, "one model call for the tool call, one for the answer: no retry"
    kinds = [event["type"] for event in replay_events(redis_url, request.turn_id)]
    assert kinds.count("final") == 1 and "retry" not in kinds and "error" not in kinds

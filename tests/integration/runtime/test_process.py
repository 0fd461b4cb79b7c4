"""The runtime a delivery is given is the one it uses (worker.runtime.delivery.process): run in this process
against the real Postgres and Redis and the model stub, with a runtime built by hand beside the
process's own.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from chatq.settings import get_settings, reset_settings
from models.db import get_engine
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.openai_stub import OpenAIStub
from worker.events import get_redis
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session
from worker.runtime.delivery.process import Runtime, current_runtime
from worker.runtime.delivery.runner import Outcome, execute_turn
from worker.runtime.observers import hooks
from worker.runtime.policy.retry import RetryPolicy
from worker.wiring import get_hooks


@pytest.fixture
def stub(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


class Points(hooks.TurnHooks):
    """The hook points one turn reached, in order."""

    def __init__(self, turn_id: uuid.UUID) -> None:
        self.turn_id = turn_id
        self.seen: list[str] = []


def _note(point: str) -> Any:
    def note(self: Points, event: Any) -> None:
        if (event.turn.turn_id if hasattr(event, "turn") else event.turn_id) == self.turn_id:
            self.seen.append(point)

    return note


for _point in hooks.POINTS:
    setattr(Points, _point, _note(_point))


def _request(content: str) -> TurnRequest:
    session_id = create_session(framework="langgraph", model="gpt-4o-mini")
    return parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
    )


def _own_runtime(turn_id: uuid.UUID, **settings: Any) -> tuple[Runtime, Points]:
    points = Points(turn_id)
    chosen = dataclasses.replace(get_settings(), **settings)
    runtime = Runtime(
        settings=chosen,
        hooks=hooks.HookRegistry([points]),
        leases=current_runtime().leases,
        retry=RetryPolicy.from_settings(chosen),
        engine=get_engine(),
        redis=get_redis(),
    )
    return runtime, points


def test_a_delivery_calls_the_hooks_of_the_runtime_it_is_given(stub: OpenAIStub) -> None:
    request = _request("hello [words: 3]")
    runtime, points = _own_runtime(request.turn_id)
    bystander = Points(request.turn_id)
    get_hooks().add(bystander)
    try:
        result = execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=runtime)
    finally:
        get_hooks().remove(bystander)
    assert result.outcome is Outcome.SUCCEEDED
    assert points.seen == ["before_claim", "started", "first_text", "succeeded", "ended"]
    assert bystander.seen == []


def test_a_delivery_retries_by_the_settings_of_the_runtime_it_is_given(stub: OpenAIStub) -> None:
    # The process's settings allow two attempts (a failure is retried); the given runtime's, one.
    assert get_settings().max_attempts == 2
    request = _request("hi [fail]")
    runtime, points = _own_runtime(request.turn_id, max_attempts=1)
    result = execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=runtime)
    assert result.outcome is Outcome.FAILED and result.attempt == 1
    assert "retried" not in points.seen and "failed" in points.seen


def test_the_process_runtime_follows_the_settings(stub: OpenAIStub) -> None:
    runtime = current_runtime()
    assert current_runtime() is runtime and runtime.settings is get_settings()
    assert runtime.hooks is get_hooks()
    # The connections are values on it, the process's own (the edge built them once).
    assert runtime.engine is get_engine() and runtime.redis is get_redis()
    with environ(CHATQ_MAX_ATTEMPTS="5"):
        reset_settings()
        changed = current_runtime()
        assert changed is not runtime
        assert changed.settings.max_attempts == changed.retry.max_attempts == 5
    reset_settings()

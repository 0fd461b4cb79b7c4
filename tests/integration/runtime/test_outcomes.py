"""Every outcome of one delivery, run in this process: `execute_turn` against the real Postgres and
Redis and the model stub over HTTP, without Celery in between.

The end-to-end tests (tests/integration/worker) keep one case per wiring; these cover the runner's
branches fast and without polling a worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from chatq.settings import get_settings, reset_settings
from models.db import session_scope
from models.tables import Turn, TurnStatus
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, stored_turn, turn_messages
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import cancel_turn, create_session
from worker.runtime.delivery.runner import Outcome, Result, execute_turn

WORKER = "in-process@test"


@pytest.fixture
def runtime(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """Settings of a worker that talks to the stub (no retry delay, so nothing waits)."""
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


def _request(session_id: uuid.UUID, content: str, turn_id: uuid.UUID | None = None) -> TurnRequest:
    """A raw producer's message, parsed as the task body parses it (its turn is not yet stored)."""
    turn_id = turn_id or uuid.uuid4()
    return parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(turn_id), settings=get_settings()
    )


def _run(request: TurnRequest) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker=WORKER, runtime=build_runtime())


def _session() -> uuid.UUID:
    return create_session(framework="langgraph", model="gpt-4o-mini")


def _types(redis_url: str, turn_id: uuid.UUID) -> list[str]:
    return [event["type"] for event in replay_events(redis_url, turn_id)]


def test_a_turn_runs_and_stores_its_reply_once(runtime: OpenAIStub, redis_url: str) -> None:
    request = _request(_session(), "hello [words: 5]")
    result = _run(request)
    assert result.outcome is Outcome.SUCCEEDED and result.attempt == 1
    assert stored_turn(request.turn_id).status is TurnStatus.SUCCEEDED
    assert [m.role for m in turn_messages(request.turn_id)] == ["user", "assistant"]
    types = _types(redis_url, request.turn_id)
    assert types[0] == "started" and types[-1] == "final" and "text" in types

    again = _run(request)  # a duplicate delivery of a finished turn
    assert again.outcome is Outcome.SKIPPED
    assert len(turn_messages(request.turn_id)) == 2
    assert _types(redis_url, request.turn_id) == types


def test_an_agent_error_asks_for_one_retry_then_succeeds(runtime: OpenAIStub, redis_url: str) -> None:
    request = _request(_session(), f"hi [fail-once: {uuid.uuid4()}]")
    first = _run(request)
    assert first.outcome is Outcome.RETRY and first.retry_after is not None
    assert stored_turn(request.turn_id).status is TurnStatus.QUEUED
    second = _run(request)
    assert second.outcome is Outcome.SUCCEEDED and second.attempt == 2
    row = stored_turn(request.turn_id)
    assert (row.status, row.attempts) == (TurnStatus.SUCCEEDED, 2)
    assert "retry" in _types(redis_url, request.turn_id)


def test_an_agent_that_fails_every_attempt_fails_the_turn_with_its_error(runtime: OpenAIStub, redis_url: str) -> None:
    request = _request(_session(), "hi [fail]")
    assert _run(request).outcome is Outcome.RETRY
    result = _run(request)
    assert result.outcome is Outcome.FAILED
    row = stored_turn(request.turn_id)
    assert row.status is TurnStatus.FAILED and row.error
    assert [m.role for m in turn_messages(request.turn_id)] == ["user"]
    assert _types(redis_url, request.turn_id)[-1] == "error"
    assert _run(request).outcome is Outcome.SKIPPED  # a late copy changes nothing


def test_a_later_turn_waits_while_an_earlier_one_is_unfinished(runtime: OpenAIStub) -> None:
    session_id = _session()
    first, second = _request(session_id, "first"), _request(session_id, "second")
    # The first is stored (by its own delivery, which fails once and goes back to waiting).
    first_failing = _request(session_id, f"first [fail-once: {uuid.uuid4()}]", first.turn_id)
    assert _run(first_failing).outcome is Outcome.RETRY
    busy = _run(second)
    assert busy.outcome in (Outcome.BUSY, Outcome.SKIPPED)
    assert stored_turn(second.turn_id).status is TurnStatus.QUEUED
    assert _run(first_failing).outcome is Outcome.SUCCEEDED
    assert _run(second).outcome is Outcome.SUCCEEDED
    assert stored_turn(second.turn_id).position > stored_turn(first.turn_id).position


def test_a_turn_cancelled_before_its_delivery_is_not_run(runtime: OpenAIStub, redis_url: str) -> None:
    session_id = _session()
    blocker = _request(session_id, f"first [fail-once: {uuid.uuid4()}]")
    assert _run(blocker).outcome is Outcome.RETRY
    request = _request(session_id, "never mind")
    assert _run(request).outcome in (Outcome.BUSY, Outcome.SKIPPED)  # stored, waiting its turn
    assert cancel_turn(request.turn_id).status is TurnStatus.CANCELLED
    assert _run(request).outcome in (Outcome.CANCELLED, Outcome.SKIPPED)
    assert stored_turn(request.turn_id).status is TurnStatus.CANCELLED
    assert [m.role for m in turn_messages(request.turn_id)] == ["user"]
    assert not any("never mind" in str(body) for body in runtime.requests)


def test_a_raw_message_for_a_new_session_creates_it_and_runs(runtime: OpenAIStub) -> None:
    request = _request(uuid.uuid4(), "hello")
    assert _run(request).outcome is Outcome.SUCCEEDED
    assert stored_turn(request.turn_id).session_id == request.session_id


def test_a_reply_to_no_stored_message_is_refused_and_stores_nothing(runtime: OpenAIStub, redis_url: str) -> None:
    session_id = _session()
    turn_id = uuid.uuid4()
    request = parse_turn_request(
        {"session_id": str(session_id), "content": "hello", "reply_to": 987654},
        task_id=str(turn_id),
        settings=get_settings(),
    )
    assert _run(request).outcome is Outcome.FAILED
    with session_scope() as db:
        assert db.get(Turn, turn_id) is None
    events = replay_events(redis_url, turn_id)
    assert [event["type"] for event in events] == ["error"]
    assert "reply_to" in events[0]["error"]
    assert not any("hello" in str(body) for body in runtime.requests)


def test_a_turn_id_of_another_session_is_refused_and_the_other_turn_untouched(runtime: OpenAIStub) -> None:
    owner = _request(_session(), "mine")
    assert _run(owner).outcome is Outcome.SUCCEEDED
    intruder = _request(_session(), "yours", owner.turn_id)
    assert _run(intruder).outcome is Outcome.FAILED
    assert next(m.content for m in turn_messages(owner.turn_id)) == "mine"
    assert stored_turn(owner.turn_id).status is TurnStatus.SUCCEEDED

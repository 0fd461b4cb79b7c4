"""The lifecycle hooks a turn's deliveries emit (worker.runtime.observers.hooks), run in this process: `execute_turn`
against the real Postgres and Redis and the model stub, with a recording hook registered.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from chatq.settings import get_settings
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import cancel_turn, create_session
from worker.runtime.delivery.runner import Outcome, Result, execute_turn
from worker.runtime.observers import hooks
from worker.runtime.policy.retry import RetryCause
from worker.wiring import get_hooks


class Recording(hooks.TurnHooks):
    """Every hook call about one turn, in order, as (point, payload)."""

    def __init__(self, turn_id: uuid.UUID) -> None:
        self.turn_id = turn_id
        self.calls: list[tuple[str, Any]] = []
        self.seen = threading.Condition()

    def points(self) -> list[str]:
        return [point for point, _ in self.calls]

    def payloads(self, point: str) -> list[Any]:
        return [payload for name, payload in self.calls if name == point]

    def wait_for(self, point: str, timeout: float = 20.0) -> None:
        with self.seen:
            if not self.seen.wait_for(lambda: point in self.points(), timeout):
                raise AssertionError(f"no {point} hook within {timeout}s: {self.points()}")


def _recorder(point: str) -> Any:
    def record(self: Recording, event: Any) -> None:
        turn_id = event.turn.turn_id if hasattr(event, "turn") else event.turn_id
        if turn_id == self.turn_id:
            with self.seen:
                self.calls.append((point, event))
                self.seen.notify_all()

    return record


for _point in hooks.POINTS:
    setattr(Recording, _point, _recorder(_point))


class Raising(hooks.TurnHooks):
    """A hook broken at every point (registered before the recorder: neither the turn nor it may notice)."""


def _raise(self: Raising, event: Any) -> None:
    raise RuntimeError("a broken observer")


for _point in hooks.POINTS:
    setattr(Raising, _point, _raise)


@pytest.fixture
def runtime(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """Settings of a worker that talks to the stub (no retry delay, so nothing waits)."""
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        yield openai_stub


def _request(session_id: uuid.UUID, content: str) -> TurnRequest:
    return parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
    )


def _run(request: TurnRequest) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())


@pytest.fixture
def session_id(runtime: OpenAIStub) -> uuid.UUID:
    return create_session(framework="langgraph", model="gpt-4o-mini")


@pytest.fixture
def recorded() -> Iterator[list[Recording]]:
    """The recorders a test registered (`_record`), removed again afterwards."""
    made: list[Recording] = []
    yield made
    for recording in made:
        get_hooks().remove(recording)


def _record(made: list[Recording], turn_id: uuid.UUID) -> Recording:
    recording = Recording(turn_id)
    get_hooks().add(recording)
    made.append(recording)
    return recording


RAN = ["before_claim", "started"]


def test_a_succeeded_turn(session_id: uuid.UUID, recorded: list[Recording]) -> None:
    request = _request(session_id, "hello [words: 5]")
    recording = _record(recorded, request.turn_id)
    succeeded_before = REGISTRY.get_sample_value("chatq_turns_total", {"status": "succeeded"}) or 0.0
    assert _run(request).outcome is Outcome.SUCCEEDED
    assert recording.points() == [*RAN, "first_text", "succeeded", "ended"]
    [claiming] = recording.payloads("before_claim")
    assert (claiming.session_id, claiming.queue, claiming.worker) == (session_id, "chatq", "in-process@test")
    [started] = recording.payloads("started")
    assert started.turn == hooks.Facts(
        turn_id=request.turn_id,
        session_id=session_id,
        attempt=1,
        framework="langgraph",
        model="gpt-4o-mini",
        has_webhook=False,
    )
    assert started.deliveries == 1
    [succeeded] = recording.payloads("succeeded")
    assert succeeded.messages == 1 and succeeded.completion_tokens > 0
    assert succeeded.total_tokens == succeeded.prompt_tokens + succeeded.completion_tokens
    [first_text] = recording.payloads("first_text")
    assert 0 < first_text.seconds <= succeeded.seconds
    [ended] = recording.payloads("ended")
    assert (ended.outcome, ended.error) == ("succeeded", None) and ended.seconds >= succeeded.seconds
    # The metrics are a hook too: they counted this turn.
    assert REGISTRY.get_sample_value("chatq_turns_total", {"status": "succeeded"}) == succeeded_before + 1

    assert _run(request).outcome is Outcome.SKIPPED  # a duplicate runs nothing
    assert recording.points()[5:] == ["before_claim"]


def test_a_retried_then_succeeded_turn(session_id: uuid.UUID, recorded: list[Recording]) -> None:
    request = _request(session_id, f"hi [fail-once: {uuid.uuid4()}]")
    recording = _record(recorded, request.turn_id)
    retries_before = REGISTRY.get_sample_value("chatq_turn_retries_total") or 0.0
    assert _run(request).outcome is Outcome.RETRY
    assert _run(request).outcome is Outcome.SUCCEEDED
    assert recording.points() == [*RAN, "retried", "ended", *RAN, "first_text", "succeeded", "ended"]
    [retried] = recording.payloads("retried")
    assert (retried.cause, retried.delay, retried.turn.attempt) == (RetryCause.AGENT_FAILURE, 0.0, 1)
    assert retried.error
    assert [e.outcome for e in recording.payloads("ended")] == ["retry", "succeeded"]
    assert [s.turn.attempt for s in recording.payloads("started")] == [1, 2]
    assert REGISTRY.get_sample_value("chatq_turn_retries_total") == retries_before + 1


def test_a_failed_turn(session_id: uuid.UUID, recorded: list[Recording]) -> None:
    request = _request(session_id, "hi [fail]")
    recording = _record(recorded, request.turn_id)
    failed_before = REGISTRY.get_sample_value("chatq_turns_total", {"status": "failed"}) or 0.0
    assert _run(request).outcome is Outcome.RETRY
    result = _run(request)
    assert result.outcome is Outcome.FAILED
    assert recording.points() == [*RAN, "retried", "ended", *RAN, "failed", "ended"]
    [failed] = recording.payloads("failed")
    assert (failed.turn.attempt, failed.error, failed.at_claim) == (2, result.error, False)
    assert recording.payloads("ended")[-1].outcome == "failed"
    assert recording.payloads("ended")[-1].error == result.error
    assert REGISTRY.get_sample_value("chatq_turns_total", {"status": "failed"}) == failed_before + 1


def test_a_turn_cancelled_while_running_and_a_copy_delivered_meanwhile(
    session_id: uuid.UUID, recorded: list[Recording]
) -> None:
    request = _request(session_id, "go on [slow: 0.2] [words: 100]")
    recording = _record(recorded, request.turn_id)
    results: list[Result] = []
    running = threading.Thread(target=lambda: results.append(_run(request)))
    running.start()
    try:
        recording.wait_for("first_text")
        # A copy of the message while the turn runs here: the policy says when to look again.
        assert _run(request).outcome is Outcome.BUSY
        cancel_turn(request.turn_id)
    finally:
        running.join(timeout=30)
    assert [r.outcome for r in results] == [Outcome.CANCELLED]
    points = recording.points()
    copy = points.index("retried")
    assert points[copy - 1 : copy + 1] == ["before_claim", "retried"]  # the copy claimed nothing
    del points[copy - 1 : copy + 1]
    assert points == [*RAN, "first_text", "cancelled", "ended"]
    [busy] = recording.payloads("retried")
    assert busy.cause is RetryCause.BUSY and busy.delay > 0.5 and busy.turn.attempt == 0
    [cancelled] = recording.payloads("cancelled")
    assert not cancelled.at_claim and cancelled.turn.attempt == 1
    assert recording.payloads("ended")[0].outcome == "cancelled"


def test_a_turn_with_a_tool_call(session_id: uuid.UUID, recorded: list[Recording]) -> None:
    request = _request(session_id, "what is it [calc: 6*7]")
    recording = _record(recorded, request.turn_id)
    assert _run(request).outcome is Outcome.SUCCEEDED
    tools = recording.payloads("tool")
    assert tools and {tool.name for tool in tools} == {"calculator"}
    points = recording.points()
    assert points[:2] == RAN and points[-2:] == ["succeeded", "ended"]
    assert points.index("tool") < points.index("succeeded")


def test_a_hook_that_raises_everywhere_changes_nothing(session_id: uuid.UUID, recorded: list[Recording]) -> None:
    request = _request(session_id, f"hi [fail-once: {uuid.uuid4()}]")
    broken = Raising()
    registry = get_hooks()
    registry.add(broken)  # before the recorder, so the recorder is called after it raised
    try:
        recording = _record(recorded, request.turn_id)
        assert _run(request).outcome is Outcome.RETRY
        assert _run(request).outcome is Outcome.SUCCEEDED
    finally:
        registry.remove(broken)
    assert recording.points() == [*RAN, "retried", "ended", *RAN, "first_text", "succeeded", "ended"]

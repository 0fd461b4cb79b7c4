"""Back-pressure from the model service, and limits shared by two real workers (issue: real providers)."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.provider.conftest import CAPPED_MODEL
from tests.support.openai_stub import OpenAIStub
from tests.support.provider_limits import ProviderLimits
from tests.support.turns import replay_events, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def _model() -> str:
    """A model name of the test's own, so no other test's limits state is shared in Redis."""
    return f"m-{uuid.uuid4().hex[:8]}"


def test_a_429_before_the_first_token_waits_and_uses_no_attempt(
    workers: list[WorkerProcess], provider: OpenAIStub, redis_url: str
) -> None:
    session_id = create_session(framework="langgraph", model=_model())
    turn = submit_turn(session_id, f"hello [ratelimit-times: {uuid.uuid4()} 3]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1, "a refusal by the service must not use up the turn's retry"
    assert [r["status"] for r in provider.replies] == [429, 429, 429, 200]
    events = replay_events(redis_url, turn.turn_id)
    waits = [e for e in events if e["type"] == "retry"]
    assert [e["waiting"]["reason"] for e in waits] == ["rate_limited"] * 3
    assert all(e["waiting"]["until"] > e["ts"] for e in waits)
    assert "HTTP 429" in waits[0]["error"]
    assert events[-1]["type"] == "final"


def test_a_503_waits_too_and_a_500_keeps_the_retry_once_rule(
    workers: list[WorkerProcess], provider: OpenAIStub
) -> None:
    session_id = create_session(framework="none", model=_model())
    overloaded = submit_turn(session_id, f"hi [overloaded-times: {uuid.uuid4()} 2]")
    assert (row := wait_for_turn(overloaded.turn_id)).status.value == "succeeded", row.error
    assert row.attempts == 1
    failing = submit_turn(create_session(framework="none", model=_model()), "hi [fail]")
    row = wait_for_turn(failing.turn_id)
    assert row.status.value == "failed" and row.attempts == 2 and "HTTP 500" in (row.error or "")


def test_a_401_is_never_retried(workers: list[WorkerProcess], provider: OpenAIStub) -> None:
    turn = submit_turn(create_session(framework="plain_openai", model=_model()), "hi [unauthorized]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "failed"
    assert [r["status"] for r in provider.replies] == [401, 401]  # the ordinary retry, no waiting
    assert "sk-test" not in (row.error or "")


def test_two_workers_keep_a_configured_concurrency_limit(workers: list[WorkerProcess], provider: OpenAIStub) -> None:
    # The provider answers 429 past 2 requests in flight; the workers (8 threads in all) are told
    # max_concurrent 2 for this model, so none is refused and all turns succeed.
    provider.limits = ProviderLimits(max_concurrent=2)
    sessions = [create_session(framework="none", model=CAPPED_MODEL) for _ in range(8)]
    turns = [submit_turn(session_id, "hold on [sleep: 0.4]") for session_id in sessions]
    rows = wait_for_turns([t.turn_id for t in turns], timeout=90)
    assert all(r.status.value == "succeeded" for r in rows.values()), [r.error for r in rows.values()]
    stats = provider.limits.stats()
    assert stats["refused"] == 0 and stats["ok"] == 8
    assert stats["peak"] == 2, "the limit held, and both workers used it"
    assert {r.worker.split("@")[0] for r in rows.values() if r.worker} == {w.name for w in workers}


def test_without_configuration_a_rate_limited_provider_fails_no_turn(
    workers: list[WorkerProcess], provider: OpenAIStub
) -> None:
    # 120 requests per minute with a 1 s burst: the first requests of the burst are refused, the
    # fleet learns the limit from the 429's headers and paces itself below it.
    provider.limits = ProviderLimits(rpm=120)
    model = _model()
    turns = [submit_turn(create_session(framework="none", model=model), f"turn {i}") for i in range(16)]
    rows = wait_for_turns([t.turn_id for t in turns], timeout=120)
    assert all(r.status.value == "succeeded" for r in rows.values()), [r.error for r in rows.values()]
    assert all(r.attempts == 1 for r in rows.values())
    stats = provider.limits.stats()
    assert stats["ok"] == 16
    assert stats["refused"] < stats["ok"], "after the first refusals the workers paced themselves"

"""Back-pressure from the model service, and limits shared by two real workers (issue: real providers)."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.provider.conftest import CAPPED_MODEL, PAIR_MODEL, PATIENCE, SOLO_MODEL
from tests.support.openai_stub import OpenAIStub
from tests.support.provider_limits import ProviderLimits
from tests.support.turns import replay_events, wait_for_status, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.events import get_redis
from worker.producer import create_session, submit_turn
from worker.runtime.policy import limits

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


def test_a_service_that_keeps_refusing_fails_the_turn_after_the_patience(
    workers: list[WorkerProcess], provider: OpenAIStub, redis_url: str
) -> None:
    turn = submit_turn(create_session(framework="none", model=_model()), f"hi [ratelimit-times: {uuid.uuid4()} 9999]")
    row = wait_for_turn(turn.turn_id, timeout=60)
    assert row.status.value == "failed"
    assert row.error == (
        f"the model service is rate limiting requests (HTTP 429), and kept refusing for {PATIENCE:g} s"
        " (CHATQ_PROVIDER_PATIENCE)"
    )
    assert len(provider.replies) > 3 and {r["status"] for r in provider.replies} == {429}
    assert replay_events(redis_url, turn.turn_id)[-1]["type"] == "error"


def test_an_interactive_turn_takes_the_next_slot_ahead_of_waiting_batch_turns(
    workers: list[WorkerProcess], provider: OpenAIStub, redis_url: str
) -> None:
    batch = [
        submit_turn(create_session(framework="none", model=SOLO_MODEL), "batch [sleep: 0.3]", queue="chatq.batch")
        for _ in range(6)
    ]
    wait_for_status(batch[0].turn_id, "running", timeout=30)
    interactive = submit_turn(create_session(framework="none", model=SOLO_MODEL), "me first")
    rows = wait_for_turns([t.turn_id for t in [*batch, interactive]], timeout=90)
    assert all(r.status.value == "succeeded" for r in rows.values()), [r.error for r in rows.values()]

    def started(turn_id: uuid.UUID) -> float:
        return next(e["ts"] for e in replay_events(redis_url, turn_id) if e["type"] == "started")

    mine = started(interactive.turn_id)
    behind = [t for t in batch if started(t.turn_id) > mine]
    # Submitted while the batch held the one slot and five batch turns waited: at most the turn
    # whose slot was being handed over when it arrived goes before it.
    assert len(behind) >= 4, f"only {len(behind)} of the waiting batch turns started after the interactive one"


def test_a_windowed_provider_is_waited_out_together_and_its_named_limit_kept(
    workers: list[WorkerProcess], provider: OpenAIStub
) -> None:
    # Issue 34: 6 requests per fixed 3 s window (`x-ratelimit-limit-requests: 120` per minute),
    # four windows' worth of batch turns at once. The burst spends the first window; the fleet
    # then waits for the reset together and paces itself to 95% of the named limit. Before, it
    # lowered its rate from what it "sent" while it waited, again and again, and trickled.
    provider.limits = ProviderLimits(rpm=120, window=3.0)
    model = _model()
    turns = [
        submit_turn(create_session(framework="none", model=model), f"turn {i}", queue="chatq.batch") for i in range(24)
    ]
    rows = wait_for_turns([t.turn_id for t in turns], timeout=120)
    assert all(r.status.value == "succeeded" for r in rows.values()), [r.error for r in rows.values()]
    assert all(r.attempts == 1 for r in rows.values())
    scope = limits.Scope(key=f"{model}@{provider.base_url.rstrip('/')}", model=model)
    assert limits.state(get_redis(), scope).rpm >= 0.95 * 120 - 0.01, "the limit the service named was kept"
    answers = sorted(provider.limits.answers)
    refused = [at for at, status in answers if status != 200]
    # Only requests already on their way when the first window was spent were refused.
    assert refused and max(refused) - answers[0][0] < 3.0 and len(refused) <= 12, len(refused)


def test_interactive_turns_waiting_for_a_slot_come_back_about_once(
    workers: list[WorkerProcess], provider: OpenAIStub, redis_url: str
) -> None:
    # Eight interactive turns, two slots, about a second each: six wait. Each is told when the
    # slot its place in line gets frees. Before, each came back every half second (a claim, a
    # hold and a `retry` event each time): the last of them six times.
    turns = [submit_turn(create_session(framework="none", model=PAIR_MODEL), "hold on [sleep: 1]") for _ in range(8)]
    rows = wait_for_turns([t.turn_id for t in turns], timeout=90)
    assert all(r.status.value == "succeeded" for r in rows.values()), [r.error for r in rows.values()]
    waits = [
        sum(1 for e in replay_events(redis_url, t.turn_id) if e["type"] == "retry" and e.get("waiting")) for t in turns
    ]
    assert sum(waits) <= 6 * 2 and max(waits) <= 3, waits

"""SIGTERM (a rolling deploy): the worker hands its running turn back at once and another finishes it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.faults.helpers import STUB_MODEL, Worker, Workers, wait_finished, wait_for_event
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(worker_env: dict[str, str]) -> Iterator[Workers]:
    """The module's workers (a start-up costs seconds of CPU); killed after the module."""
    workers = Workers(worker_env)
    try:
        yield workers
    finally:
        workers.kill_all()


@pytest.fixture
def pair(pool: Workers) -> Iterator[list[Worker]]:
    """Two live workers for each test: the one a test stopped is replaced, the other kept."""
    yield pool.top_up(2)
    print(pool.logs())  # shown only when the test failed


WORDS, SLOW = 80, 0.1
"""The turn streams for about WORDS * SLOW seconds."""


@pytest.mark.timeout(90)
def test_sigterm_hands_the_running_turn_back_and_another_worker_finishes_it(
    pool: Workers, pair: list[Worker], redis_url: str
) -> None:
    first, second = pair
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, f"a long answer please [words: {WORDS}] [slow: {SLOW}]")
    wait_for_event(redis_url, turn.turn_id, "text", count=5, timeout=30)
    leaving = pool.owner_of(turn.turn_id)
    staying = second if leaving is first else first

    stopped_at = time.monotonic()
    code = leaving.stop(timeout=30)
    exit_seconds = time.monotonic() - stopped_at
    print(f"\nworker exit after SIGTERM: {exit_seconds:.2f}s (the turn had about {WORDS * SLOW - 0.5:.0f}s to go)")
    assert code == 0, leaving.log()[-3000:]
    # Not after the turn would have finished: it still had ~7 s of streaming left.
    assert exit_seconds < 5.0

    row = wait_finished([turn.turn_id], timeout=60)[turn.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(staying.hostname_prefix)
    assert staying.alive
    stored = turn_messages(turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content.split() == [f"w{i}" for i in range(1, WORDS + 1)]

    events = replay_events(redis_url, turn.turn_id)
    types = [event["type"] for event in events]
    assert types.count("final") == 1 and types[-1] == "final"
    retries = [event for event in events if event["type"] == "retry"]
    assert len(retries) == 1 and "shutting down" in retries[0]["error"]
    handed_back_at = types.index("retry")
    assert types.count("started") == 2 and "started" in types[handed_back_at:]
    # A hand-back is not a failed invocation: the turn is still on its first attempt.
    assert row.attempts == 1
    # A consumer that drops text on `retry` (SPEC) shows the reply exactly once.
    shown = "".join(event["text"] for event in events[handed_back_at:] if event["type"] == "text")
    assert shown == stored[1].content


STALL_SECONDS = 60.0
"""How long the silent model sends nothing the first time it is asked."""


@pytest.mark.timeout(120)
def test_sigterm_hands_back_a_turn_whose_model_sends_nothing_at_once(
    pool: Workers, pair: list[Worker], redis_url: str, openai_stub: OpenAIStub
) -> None:
    first, second = pair
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    key = uuid.uuid4().hex
    turn = submit_turn(session_id, f"think it over [sleep-once: {key} {STALL_SECONDS:g}] [words: 4]")
    # The model has the request and says nothing: the worker is blocked in its socket read.
    deadline = time.monotonic() + 20
    while not any(key in json.dumps(body) for body in openai_stub.requests):
        assert time.monotonic() < deadline, "the model never got the request"
        time.sleep(0.05)
    leaving = pool.owner_of(turn.turn_id)
    staying = second if leaving is first else first

    stopped_at = time.monotonic()
    code = leaving.stop(timeout=STALL_SECONDS)
    exit_seconds = time.monotonic() - stopped_at
    row = wait_finished([turn.turn_id], timeout=STALL_SECONDS)[turn.turn_id]
    done_seconds = time.monotonic() - stopped_at
    print(
        f"\nsilent turn: worker exit after SIGTERM {exit_seconds:.2f}s, turn done elsewhere after {done_seconds:.2f}s"
    )
    assert code == 0, leaving.log()[-3000:]
    # Without closing the request the worker would wait out the stall (or its soft shutdown timeout).
    assert done_seconds < STALL_SECONDS / 4
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(staying.hostname_prefix)
    assert row.attempts == 1  # a hand-back is not a failed invocation
    assert [m.role for m in turn_messages(turn.turn_id)] == ["user", "assistant"]
    types = [event["type"] for event in replay_events(redis_url, turn.turn_id)]
    assert types.count("retry") == 1 and types[-1] == "final" and "error" not in types

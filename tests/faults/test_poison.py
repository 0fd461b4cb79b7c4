"""A poison turn (its worker dies every time it runs it) is failed after CHATQ_MAX_DELIVERIES deliveries."""

from __future__ import annotations

import time

import pytest

from tests.faults.helpers import STUB_MODEL, Beat, Workers, load_turns, wait_finished
from tests.support.poison import TOOL_NAME
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

MAX_DELIVERIES = 2
POISON_ENV = {"CHATQ_PLUGINS": "tests.support.poison", "CHATQ_MAX_DELIVERIES": str(MAX_DELIVERIES)}


@pytest.mark.timeout(150)
def test_a_turn_that_kills_its_worker_every_time_is_failed_after_max_deliveries(
    workers: Workers, beat: Beat, redis_url: str
) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    poison = submit_turn(session_id, f"press the red button [tool: {TOOL_NAME} {{}}]")

    deaths = 0
    deadline = time.monotonic() + 120
    while load_turns([poison.turn_id])[poison.turn_id].status.value in ("queued", "running"):
        assert time.monotonic() < deadline, f"the poison turn is still unfinished after {deaths} worker deaths"
        assert deaths <= MAX_DELIVERIES, "more workers died than CHATQ_MAX_DELIVERIES allows"
        worker = workers.one(env=POISON_ENV)
        # It dies as soon as it runs the turn (once the sweeper has re-sent it), or it ends the turn.
        while worker.alive and load_turns([poison.turn_id])[poison.turn_id].status.value in ("queued", "running"):
            assert time.monotonic() < deadline, "no worker death and no end of the turn"
            time.sleep(0.1)
        if not worker.alive:
            deaths += 1
            assert worker.process is not None and worker.process.returncode == -9, worker.log()[-2000:]

    row = wait_finished([poison.turn_id], timeout=5)[poison.turn_id]
    events = replay_events(redis_url, poison.turn_id)
    types = [event["type"] for event in events]
    print(f"\npoison turn: {deaths} worker deaths, deliveries={row.deliveries}, error={row.error!r}")
    assert row.status.value == "failed"
    assert deaths == MAX_DELIVERIES
    assert row.deliveries == MAX_DELIVERIES
    assert types.count("started") == MAX_DELIVERIES
    assert types.count("error") == 1 and types[-1] == "error"
    assert "final" not in types
    assert row.error is not None and "\n" not in row.error
    assert str(MAX_DELIVERIES) in row.error and "CHATQ_MAX_DELIVERIES" in row.error
    assert [m.role for m in turn_messages(poison.turn_id)] == ["user"]

    # The session is not stuck behind it: a normal turn runs (on the worker still alive).
    assert workers.alive, "the worker that ended the poison turn should still run"
    normal = submit_turn(session_id, "are you all right? [words: 6]")
    after = wait_finished([normal.turn_id], timeout=30)[normal.turn_id]
    assert after.status.value == "succeeded", after.error
    assert [m.role for m in turn_messages(normal.turn_id)] == ["user", "assistant"]
    assert all(worker.alive for worker in workers.alive)

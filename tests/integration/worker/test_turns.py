"""The main job end to end: producer -> Redis -> the runtime -> handler over HTTP -> Postgres + events.

The turns run in this process (`in_process`: the worker's runtime taking the same messages off the
test's Redis); the last two tests are the real-worker case of running turns: a `chatq worker`'s
pool runs sessions side by side, and Celery's late acknowledgement delivers duplicates to it.
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from models.db import session_scope
from models.tables import Turn
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.broker import wait_for_drained_queues
from tests.support.inprocess import InProcessWorker
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, session_messages, turn_messages, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.events import get_redis
from worker.producer import create_session, submit_turn


def _session(**kwargs: str) -> uuid.UUID:
    return create_session(framework=kwargs.get("framework", "langgraph"), model=kwargs.get("model", STUB_MODEL))


def test_turn_streams_events_in_order_and_rows_match(in_process: InProcessWorker, redis_url: str) -> None:
    session_id = _session()
    turn = submit_turn(session_id, "hello there [words: 12]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1

    events = replay_events(redis_url, turn.turn_id)
    types = [event["type"] for event in events]
    assert types[0] == "queued" and types[1] == "started" and types[-1] == "final"
    assert types.count("final") == 1
    assert set(types[2:-1]) == {"text"}
    assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
    assert all(event["v"] == 1 and event["turn_id"] == str(turn.turn_id) for event in events)
    assert all(event["session_id"] == str(session_id) for event in events)

    streamed = "".join(event["text"] for event in events if event["type"] == "text")
    final = events[-1]
    stored = turn_messages(turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].content == "hello there [words: 12]"
    assert stored[1].content == streamed == final["messages"][-1]["content"]
    assert len(streamed.split()) == 12
    usage = final["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )


def test_tool_call_turn_persists_every_message_in_order(in_process: InProcessWorker, redis_url: str) -> None:
    session_id = _session()
    turn = submit_turn(session_id, "what is six times seven? [calc: 6*7]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    stored = turn_messages(turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    call = stored[1].tool_calls[0]
    assert call["name"] == "calculator" and call["args"] == {"expression": "6*7"}
    assert stored[2].tool_call_id == call["id"] and stored[2].content == "42"
    assert "42" in stored[3].content
    tools = [e["tool"] for e in replay_events(redis_url, turn.turn_id) if e["type"] == "tool"]
    assert [(t["name"], t["status"]) for t in tools] == [("calculator", "started"), ("calculator", "finished")]


def test_a_failed_first_attempt_is_retried_once(in_process: InProcessWorker, redis_url: str) -> None:
    session_id = _session()
    key = uuid.uuid4().hex
    turn = submit_turn(session_id, f"flaky model [fail-once: {key}]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 2
    events = replay_events(redis_url, turn.turn_id)
    types = [e["type"] for e in events]
    assert types.count("retry") == 1 and types.count("final") == 1 and types[-1] == "final"
    assert [e["attempt"] for e in events if e["type"] == "started"] == [1, 2]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [m.role for m in turn_messages(turn.turn_id)] == ["user", "assistant"]


def test_two_failed_attempts_fail_the_turn_and_the_worker_goes_on(in_process: InProcessWorker, redis_url: str) -> None:
    session_id = _session()
    bad = submit_turn(session_id, "broken model [fail]")
    row = wait_for_turn(bad.turn_id)
    assert row.status.value == "failed"
    assert row.attempts == 2
    assert row.error and "\n" not in row.error
    assert [m.role for m in turn_messages(bad.turn_id)] == ["user"]
    events = replay_events(redis_url, bad.turn_id)
    assert [e["type"] for e in events].count("error") == 1 and events[-1]["type"] == "error"
    assert events[-1]["error"] == row.error
    assert "sk-test-not-a-secret" not in row.error

    good = submit_turn(session_id, "are you still there?")
    assert wait_for_turn(good.turn_id).status.value == "succeeded"
    # What the task saw of the failed turn: one retry, then the end (no exception, `in_process.errors`).
    in_process.wait_idle()  # the task records its outcome after the turn's row is committed
    assert in_process.outcomes(bad.turn_id) == ["retry", "failed"]


def test_turns_of_one_session_run_in_order_and_see_earlier_replies(
    in_process: InProcessWorker, openai_stub: OpenAIStub
) -> None:
    session_id = _session()
    texts = [f"message {i} [slow: 0.02]" for i in range(5)]
    submitted = [submit_turn(session_id, text) for text in texts]
    rows = wait_for_turns([t.turn_id for t in submitted], timeout=90)
    ordered = [rows[t.turn_id] for t in submitted]
    assert all(r.status.value == "succeeded" for r in ordered), [r.error for r in ordered]
    for earlier, later in itertools.pairwise(ordered):
        assert earlier.finished_at <= later.started_at
    # Each request the model got carries every earlier exchange of the session.
    requests = [
        r
        for r in openai_stub.requests
        if any(str(m.get("content")).startswith("message 4") for m in r.get("messages", []))
    ]
    contents = [str(m.get("content")) for m in requests[-1]["messages"]]
    for i in range(4):
        assert any(c.startswith(f"message {i}") for c in contents)
        assert any(c.startswith(f"You said: message {i}") for c in contents)
    stored = session_messages(session_id)
    assert [m.role for m in stored] == ["user", "assistant"] * 5
    assert [m.content for m in stored if m.role == "user"] == texts


def test_a_turn_sent_only_through_redis_is_inserted_by_the_worker(in_process: InProcessWorker) -> None:
    """A producer in another language sends just the task message; the session is unknown too."""
    from worker.dispatch import send_turn

    turn_id, session_id = uuid.uuid4(), uuid.uuid4()
    message = {"turn_id": str(turn_id), "session_id": str(session_id), "content": "hi from Go", "images": None}
    assert send_turn(message, queue="chatq", client=get_redis())
    row = wait_for_turn(turn_id)
    assert row.status.value == "succeeded", row.error
    assert [m.role for m in turn_messages(turn_id)] == ["user", "assistant"]
    assert turn_messages(turn_id)[0].content == "hi from Go"


# The real-worker case of running turns (the two tests below): a worker process's pool and Celery's delivery.
@pytest.mark.slow
def test_turns_of_different_sessions_overlap(worker: WorkerProcess) -> None:
    turns = [submit_turn(_session(), "take your time [sleep: 1.5]") for _ in range(3)]
    rows = wait_for_turns([t.turn_id for t in turns], timeout=60)
    spans = [(r.started_at, r.finished_at) for r in rows.values()]
    assert all(r.status.value == "succeeded" for r in rows.values())
    latest_start = max(start for start, _ in spans)
    earliest_end = min(end for _, end in spans)
    assert latest_start < earliest_end, "the sessions ran one after another instead of in parallel"


@pytest.mark.slow
def test_the_same_task_delivered_twice_stores_one_reply(worker: WorkerProcess) -> None:
    from worker.dispatch import send_turn

    session_id = _session()
    turn = submit_turn(session_id, "say it once [slow: 0.05]")
    message = {
        "turn_id": str(turn.turn_id),
        "session_id": str(session_id),
        "content": "say it once [slow: 0.05]",
        "images": None,
        "reply_to": None,
    }
    assert send_turn(message, queue="chatq", client=get_redis())
    assert send_turn(message, queue="chatq", client=get_redis())
    row = wait_for_turn(turn.turn_id)
    wait_for_drained_queues(worker.env["REDIS_URL"])  # the duplicate copies are processed too
    assert row.status.value == "succeeded"
    assert [m.role for m in turn_messages(turn.turn_id)] == ["user", "assistant"]
    with session_scope() as db:
        assert db.get(Turn, turn.turn_id).attempts == 1

"""Data Postgres cannot store is never an outage: the runtime rejects or fails such a turn at once.

The turns run in this process (`in_process`); the last test is the real-worker case: a message
kombu would choke on is set aside by the worker's guarded broker before Celery sees it.

Each case once retried forever (every 30 s) or ran the handler three times and failed the turn as
"its worker stopped 3 times". Now a message is rejected before anything is stored, or its turn
ends `failed` after one handler invocation, with exactly one `error` event and a clear line.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kombu import Connection, Exchange, Producer

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.inprocess import InProcessWorker
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages, wait_for_turn
from tests.support.workers import WorkerProcess
from worker.app import app
from worker.errors import TurnConflict
from worker.producer import create_session, submit_turn


def _send(kwargs: Any, *, task_id: str) -> None:
    app.send_task("chatq.run_turn", kwargs=kwargs, task_id=task_id, queue="chatq")


def _log_line(worker: WorkerProcess | InProcessWorker, *fragments: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log().splitlines():
            if all(fragment in line for fragment in fragments):
                return line
        time.sleep(0.1)
    raise AssertionError(f"worker never logged {fragments!r}:\n{worker.log()[-3000:]}")


def _events_until(redis_url: str, turn_id: uuid.UUID, kind: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = replay_events(redis_url, turn_id)
        if any(event["type"] == kind for event in events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"no {kind} event for turn {turn_id}: {replay_events(redis_url, turn_id)}")


def _stored(turn_id: uuid.UUID) -> bool:
    with session_scope() as db:
        return db.get(Turn, turn_id) is not None or (
            db.query(ChatMessage).filter(ChatMessage.turn_id == turn_id).count() > 0
        )


def _model_requests(stub: OpenAIStub, key: str) -> int:
    """Chat-completion requests of the turn whose user message holds `key`."""
    return sum(1 for body in stub.requests if any(key in str(m.get("content")) for m in body.get("messages", [])))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"reply_to": 2**63}, "reply_to must be a message id from 1 to 9223372036854775807"),
        ({"content": "caf\udce9 au lait"}, "content contains a lone surrogate (U+DCE9) at position 3"),
        ({"content": "a\x00b"}, "content contains a NUL character (U+0000)"),
        ({"images": ["https://example.test/\ud800.png"]}, "images[0] contains a lone surrogate"),
    ],
)
def test_a_raw_message_postgres_cannot_store_is_rejected_once_with_one_error_event(
    in_process: InProcessWorker, redis_url: str, fields: dict[str, Any], expected: str
) -> None:
    worker = in_process
    turn_id, session_id = uuid.uuid4(), uuid.uuid4()
    _send({"turn_id": str(turn_id), "session_id": str(session_id), "content": "hello", **fields}, task_id=str(turn_id))
    events = _events_until(redis_url, turn_id, "error")
    assert [event["type"] for event in events] == ["error"]
    assert expected in events[0]["error"]
    line = _log_line(worker, f"turn {turn_id}", "rejected")
    assert expected in line
    log = worker.log()
    assert "retrying" not in "".join(x for x in log.splitlines() if str(turn_id) in x)
    assert "Traceback" not in log
    assert not _stored(turn_id)
    with session_scope() as db:
        assert db.get(ChatSession, session_id) is None


def test_a_tool_call_with_nul_in_its_arguments_is_stored_cleaned_after_one_invocation(
    in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str
) -> None:
    key = uuid.uuid4().hex
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    # The JSON escape reaches the model stub as six characters; its tool call carries a real U+0000.
    turn = submit_turn(session_id, f'what time [tool: current_time {{"timezone": "Europe/Paris\\u0000"}}] {key}')
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1 and row.deliveries == 1
    assert _model_requests(openai_stub, key) == 2  # the tool call, then the answer: one invocation
    call = next(m for m in turn_messages(turn.turn_id) if m.tool_calls)
    assert call.tool_calls[0]["args"] == {"timezone": "Europe/Paris\ufffd"}
    tool_output = next(m for m in turn_messages(turn.turn_id) if m.role == "tool")
    assert tool_output.content.startswith("Error: unknown time zone")
    kinds = [event["type"] for event in replay_events(redis_url, turn.turn_id)]
    assert kinds.count("final") == 1 and "retry" not in kinds and "error" not in kinds


def test_assistant_text_with_nul_and_lone_surrogates_is_stored_cleaned(
    in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str
) -> None:
    session_id = create_session(framework="none", model=STUB_MODEL)
    turn = submit_turn(session_id, '[answer-json: "nul\\u0000 and \\ud800 half, \\ud83d\\ude00 whole"]')
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 1
    reply = turn_messages(turn.turn_id)[-1]
    assert reply.content == "nul\ufffd and \ufffd half, \U0001f600 whole"
    final = next(e for e in replay_events(redis_url, turn.turn_id) if e["type"] == "final")
    assert final["messages"][-1]["content"] == reply.content


def test_a_reply_postgres_refuses_fails_the_turn_after_one_invocation(
    in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str
) -> None:
    key = uuid.uuid4().hex
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    # NaN parses in Python's JSON but not in Postgres's: the tool call cannot be stored as it is.
    turn = submit_turn(session_id, f'add [tool: calculator {{"expression": NaN}}] {key}')
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "failed"
    # Since durable steps the tool call is journaled as the model returns it, before the tool runs:
    # the journal is where Postgres refuses it.
    assert row.error == (
        "Postgres could not store a step of the turn (InvalidTextRepresentation: invalid input syntax for type json)"
    )
    assert row.attempts == 1 and row.deliveries == 1
    assert _model_requests(openai_stub, key) == 1  # refused as the model returned it: the tool never ran
    kinds = [event["type"] for event in replay_events(redis_url, turn.turn_id)]
    assert kinds.count("error") == 1 and "retry" not in kinds and "final" not in kinds
    assert [m.role for m in turn_messages(turn.turn_id)] == ["user"]
    assert "infrastructure error" not in in_process.log()


def test_a_turn_id_reused_with_another_session_is_rejected_and_the_turn_goes_on(
    in_process: InProcessWorker, redis_url: str
) -> None:
    worker = in_process
    owner = create_session(framework="langgraph", model=STUB_MODEL)
    first = submit_turn(owner, "hold on [sleep: 2]")
    turn = submit_turn(owner, "the real question")  # queued behind the first
    stranger = uuid.uuid4()
    _send({"turn_id": str(turn.turn_id), "session_id": str(stranger), "content": "hijack"}, task_id=str(turn.turn_id))
    line = _log_line(worker, f"turn {turn.turn_id} session {stranger}", "rejected")
    assert f"already exists in session {owner}, not in session {stranger}" in line
    rows = {t: wait_for_turn(t) for t in (first.turn_id, turn.turn_id)}
    assert all(row.status.value == "succeeded" for row in rows.values())
    assert rows[turn.turn_id].session_id == owner
    assert [m.content for m in turn_messages(turn.turn_id)] == ["the real question", "You said: the real question"]
    assert [e["type"] for e in replay_events(redis_url, turn.turn_id)].count("error") == 0
    with session_scope() as db:
        assert db.get(ChatSession, stranger) is None

    # The Python producer refuses it too (409 on the gateway), naming no session: whoever asks
    # learns nothing of the turn's owner.
    other = create_session(framework="none", model=STUB_MODEL)
    with pytest.raises(TurnConflict) as info:
        submit_turn(other, "hijack", turn_id=turn.turn_id)
    assert info.value.message == f"turn {turn.turn_id} already exists: a turn id names one turn; use a new id"


def test_a_plain_celery_call_without_turn_id_runs_under_its_task_id(in_process: InProcessWorker) -> None:
    # What celery-node's `client.createTask("chatq.run_turn").applyAsync([], {session_id, content})` sends.
    task_id, session_id = uuid.uuid4(), uuid.uuid4()
    _send({"session_id": str(session_id), "content": "hello from node"}, task_id=str(task_id))
    row = wait_for_turn(task_id)
    assert row.status.value == "succeeded", row.error
    assert row.session_id == session_id
    assert [m.content for m in turn_messages(task_id)] == ["hello from node", "You said: hello from node"]


# The real-worker case of data errors: the broker guard (worker/runtime/broker.py) in a worker process.
@pytest.mark.slow
def test_keyword_arguments_that_are_not_an_object_are_rejected_in_one_line(
    worker: WorkerProcess, redis_url: str
) -> None:
    task_id = str(uuid.uuid4())
    headers = {"lang": "js", "task": "chatq.run_turn", "id": task_id, "root_id": task_id, "retries": 0}
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    with Connection(redis_url) as conn:
        Producer(conn).publish(
            [[], ["not", "an", "object"], embed],
            exchange=Exchange("chatq", type="direct"),
            routing_key="chatq",
            serializer="json",
            headers=headers,
        )
    # Refused before Celery sees it (worker/runtime/intake/intake.py), and set aside in chatq.dead.
    line = _log_line(worker, f"turn {task_id}", "set aside a malformed message")
    assert "the task's keyword arguments must be an object, got a list" in line
    assert "RuntimeWarning" not in worker.log()
    assert worker.alive
    assert not _stored(uuid.UUID(task_id))

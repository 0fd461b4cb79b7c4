"""Malformed task messages sent straight through Celery/kombu never crash the worker."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kombu import Connection, Exchange, Producer

from models.db import session_scope
from models.tables import ChatMessage, Turn
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.turns import wait_for_turn
from tests.support.workers import WorkerProcess
from worker.app import app
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def _send(kwargs: Any, *, task_id: str | None = None, args: tuple[Any, ...] = (), serializer: str = "json") -> str:
    task_id = task_id or str(uuid.uuid4())
    app.send_task("chatq.run_turn", args=args, kwargs=kwargs, task_id=task_id, queue="chatq", serializer=serializer)
    return task_id


def _wait_for_log(worker: WorkerProcess, fragment: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log().splitlines():
            if fragment in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"worker never logged {fragment!r}:\n{worker.log()[-3000:]}")


def _nothing_stored(turn_id: str) -> None:
    with session_scope() as db:
        assert db.get(Turn, uuid.UUID(turn_id)) is None
        assert db.query(ChatMessage).filter(ChatMessage.turn_id == uuid.UUID(turn_id)).count() == 0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"turn_id": "T", "content": "hi"}, "missing field(s): session_id"),
        ({"turn_id": "T", "session_id": "S"}, "missing field(s): content"),
        ({"turn_id": "T", "session_id": "not-a-uuid", "content": "hi"}, "session_id is not a valid UUID"),
        ({"turn_id": "T", "session_id": "S", "content": 42}, "content must be a string"),
        ({"turn_id": "T", "session_id": "S", "content": "hi", "images": "x.png"}, "images must be a list"),
        ({"turn_id": "T", "session_id": "S", "content": "hi", "reply_to": "yesterday"}, "reply_to must be"),
        ({"turn_id": "T", "session_id": "S", "content": "x" * 100_001}, "over the limit of 100000"),
        ({"turn_id": "T", "session_id": "S", "content": "   "}, "content is empty"),
    ],
)
def test_invalid_messages_are_rejected_with_a_clear_line(
    worker: WorkerProcess, kwargs: dict[str, Any], expected: str
) -> None:
    turn_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    body = {k: (turn_id if v == "T" else session_id if v == "S" else v) for k, v in kwargs.items()}
    _send(body, task_id=turn_id)
    line = _wait_for_log(worker, f"turn {turn_id}")
    assert "rejected" in line and expected in line
    _nothing_stored(turn_id)


def test_positional_arguments_and_mismatched_ids_are_rejected(worker: WorkerProcess) -> None:
    turn_id = str(uuid.uuid4())
    _send({}, task_id=turn_id, args=("hello",))
    assert "keyword arguments only" in _wait_for_log(worker, f"turn {turn_id}")
    other = str(uuid.uuid4())
    _send({"turn_id": str(uuid.uuid4()), "session_id": str(uuid.uuid4()), "content": "hi"}, task_id=other)
    assert "does not match the task id" in _wait_for_log(worker, f"turn {other}")
    _nothing_stored(turn_id)


def test_pickle_and_garbage_messages_are_refused_and_the_worker_goes_on(worker: WorkerProcess, redis_url: str) -> None:
    pickled = _send({"turn_id": "x", "session_id": "y", "content": "z"}, serializer="pickle")
    _wait_for_log(worker, "pickle")
    with Connection(redis_url) as conn:
        Producer(conn).publish(
            "\x00not json at all",
            exchange=Exchange("chatq", type="direct"),
            routing_key="chatq",
            serializer=None,
            content_type="application/json",
            content_encoding="utf-8",
        )
    time.sleep(1.0)
    assert worker.alive
    _nothing_stored(pickled) if _is_uuid(pickled) else None

    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    good = submit_turn(session_id, "still working?")
    assert wait_for_turn(good.turn_id).status.value == "succeeded"
    assert worker.alive


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True

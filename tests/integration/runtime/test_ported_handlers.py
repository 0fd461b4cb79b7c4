"""Plain handlers (written to `handlers.base.BaseAgentHandler` alone), plugged in through CHATQ_PLUGINS,
run through the runner in this process: `execute_turn` against the real Postgres and Redis.

The handlers (`tests.support.ported`) get the message as sent, images and `reply_to` included, and
read the history themselves; their reply says what they received. One of them streams, the other
has only `invoke`. tests/integration/worker/test_ported_worker.py runs them in a real worker.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from chatq.settings import get_settings
from models.tables import Turn, TurnStatus
from tests.support.env import environ
from tests.support.handlers import PORTED_FRAMEWORKS, PORTED_PLUGIN, plugin_installed
from tests.support.inprocess import build_runtime
from tests.support.turns import replay_events, stored_turn, turn_messages, wait_for_status
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import cancel_turn, create_session
from worker.runtime.delivery.runner import Outcome, Result, execute_turn

INVOKE, STREAM = PORTED_FRAMEWORKS
IMAGE = "https://x.test/cat.png"
TOOL_CALL = {"id": "call-lookup-1", "name": "lookup", "args": {"q": "weather"}}


@pytest.fixture(autouse=True)
def plugin(chatq_env: dict[str, str]) -> Iterator[None]:
    with plugin_installed(PORTED_PLUGIN, *PORTED_FRAMEWORKS), environ(CHATQ_RETRY_DELAY="0"):
        yield


def _request(session_id: uuid.UUID, content: str, **extra: Any) -> TurnRequest:
    body = {"session_id": str(session_id), "content": content, **extra}
    return parse_turn_request(body, task_id=str(uuid.uuid4()), settings=get_settings())


def _run(request: TurnRequest) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())


def _usage(row: Turn) -> tuple[int | None, int | None, int | None]:
    return row.prompt_tokens, row.completion_tokens, row.total_tokens


def test_a_streaming_plain_handler_streams_and_its_messages_and_usage_are_stored(redis_url: str) -> None:
    session_id = create_session(framework=STREAM)
    first = _request(session_id, "hello there")
    result = _run(first)
    assert (result.outcome, result.attempt) == (Outcome.SUCCEEDED, 1)
    reply = f"hello there | {STREAM} | history 0 | images 0 | reply_to None"
    stored = turn_messages(first.turn_id)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "hello there"),
        ("assistant", ""),
        ("tool", "sunny"),
        ("assistant", reply),
    ]
    assert stored[1].tool_calls == [TOOL_CALL] and stored[2].tool_call_id == TOOL_CALL["id"]

    events = replay_events(redis_url, first.turn_id)
    assert [e["type"] for e in events if e["type"] != "text"] == ["started", "tool", "tool", "final"]
    assert [e["tool"]["status"] for e in events if e["type"] == "tool"] == ["started", "finished"]
    assert "".join(e["text"] for e in events if e["type"] == "text") == reply
    final = events[-1]
    assert [m["content"] for m in final["messages"]] == ["", "sunny", reply]
    usage = final["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert _usage(stored_turn(first.turn_id)) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )

    # The message as sent reaches the handler: images, and `reply_to` (history from before it).
    again = _request(session_id, "look", images=[IMAGE], reply_to=stored[0].id)
    assert _run(again).outcome is Outcome.SUCCEEDED
    expected = f"look | {STREAM} | history 0 | images 1 | reply_to {stored[0].id}"
    assert turn_messages(again.turn_id)[-1].content == expected
    later = _request(session_id, "and now")
    assert _run(later).outcome is Outcome.SUCCEEDED
    assert "| history 8 |" in turn_messages(later.turn_id)[-1].content  # both earlier turns, four messages each


def test_a_plain_handler_without_stream_answers_with_one_final_event_from_invoke(redis_url: str) -> None:
    session_id = create_session(framework=INVOKE)
    request = _request(session_id, "just invoke", images=[IMAGE])
    assert _run(request).outcome is Outcome.SUCCEEDED
    reply = f"just invoke | {INVOKE} | history 0 | images 1 | reply_to None"
    stored = [(m.role, m.content) for m in turn_messages(request.turn_id)]
    assert stored == [("user", "just invoke"), ("assistant", reply)]
    events = replay_events(redis_url, request.turn_id)
    assert [e["type"] for e in events] == ["started", "final"]
    assert [m["content"] for m in events[-1]["messages"]] == [reply]
    usage = events[-1]["usage"]
    assert usage["total_tokens"] > 0
    assert _usage(stored_turn(request.turn_id)) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )


@pytest.mark.parametrize("framework", PORTED_FRAMEWORKS)
def test_a_plain_handlers_agent_failure_is_retried_once_then_fails_the_turn(framework: str, redis_url: str) -> None:
    request = _request(create_session(framework=framework), "please [fail]")
    first = _run(request)
    assert first.outcome is Outcome.RETRY and first.attempt == 1
    assert stored_turn(request.turn_id).status is TurnStatus.QUEUED
    second = _run(request)
    assert (second.outcome, second.attempt, second.error) == (Outcome.FAILED, 2, "The ported agent failed.")
    row = stored_turn(request.turn_id)
    assert (row.status, row.attempts, row.error) == (TurnStatus.FAILED, 2, "The ported agent failed.")
    assert [m.role for m in turn_messages(request.turn_id)] == ["user"]
    types = [e["type"] for e in replay_events(redis_url, request.turn_id)]
    assert types.count("retry") == 1 and types[-1] == "error"


def test_a_plain_handlers_bug_fails_the_turn_at_once(redis_url: str) -> None:
    request = _request(create_session(framework=INVOKE), "oops [crash]")
    result = _run(request)
    assert (result.outcome, result.attempt) == (Outcome.FAILED, 1)
    assert result.error == "the agent failed unexpectedly (internal error)"
    assert [e["type"] for e in replay_events(redis_url, request.turn_id)] == ["started", "error"]


def test_a_plain_handler_past_the_turn_timeout_fails_as_a_timeout() -> None:
    request = _request(create_session(framework=INVOKE), "slow [sleep: 20]")
    with environ(CHATQ_TURN_TIMEOUT="0.5"):
        assert _run(request).outcome is Outcome.RETRY
        result = _run(request)
    assert result.outcome is Outcome.FAILED
    assert result.error == "The model did not answer within the turn timeout (0.5 s)."


def test_a_running_plain_handler_is_cancelled_while_it_blocks(redis_url: str) -> None:
    request = _request(create_session(framework=INVOKE), "long [sleep: 40]")
    results: list[Result] = []
    running = threading.Thread(target=lambda: results.append(_run(request)), daemon=True)
    running.start()
    wait_for_status(request.turn_id, "running")
    cancel_turn(request.turn_id)
    running.join(timeout=20)  # well before the handler's 40 s: the worker stopped waiting for it
    assert [r.outcome for r in results] == [Outcome.CANCELLED]
    assert stored_turn(request.turn_id).status is TurnStatus.CANCELLED
    assert [m.role for m in turn_messages(request.turn_id)] == ["user"]
    assert replay_events(redis_url, request.turn_id)[-1]["type"] == "cancelled"

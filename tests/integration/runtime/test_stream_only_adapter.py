"""An adapter that writes only `run(turn)`, plugged in through CHATQ_PLUGINS, runs end to end
through the runner in this process: `execute_turn` against the real Postgres and Redis.

The adapter (`tests.support.stream_only`) calls no model; its reply states what the prepared input
held, so these tests see that the runner built the input (history, system prompt, the message)
and that the adapter needed nothing else: no `invoke`, no `astream`, no reading of Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from chatq.settings import get_settings
from models.db import session_scope
from models.tables import Turn, TurnStatus
from tests.support.handlers import STREAM_ONLY_PLUGIN, plugin_installed
from tests.support.inprocess import build_runtime
from tests.support.turns import replay_events, turn_messages
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session
from worker.runtime.delivery.runner import Outcome, execute_turn

FRAMEWORK = "stream_only"


@pytest.fixture
def plugin(chatq_env: dict[str, str]) -> Iterator[None]:
    with plugin_installed(STREAM_ONLY_PLUGIN, FRAMEWORK):
        yield


def _request(session_id: uuid.UUID, content: str) -> TurnRequest:
    return parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
    )


def _status(turn_id: uuid.UUID) -> TurnStatus:
    with session_scope() as db:
        turn = db.get(Turn, turn_id)
        assert turn is not None
        return turn.status


@pytest.mark.usefixtures("plugin")
def test_a_stream_only_adapter_runs_turns_through_the_runner(redis_url: str) -> None:
    session_id = create_session(framework=FRAMEWORK, system_prompt="Be brief.")

    first = _request(session_id, "hello there")
    result = execute_turn(first, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())
    assert result.outcome is Outcome.SUCCEEDED and result.attempt == 1
    assert _status(first.turn_id) is TurnStatus.SUCCEEDED
    reply = "hello there | history 0 | prompt Be brief."
    stored = [(m.role, m.content) for m in turn_messages(first.turn_id)]
    assert stored == [("user", "hello there"), ("assistant", reply)]
    events = replay_events(redis_url, first.turn_id)
    types = [event["type"] for event in events]
    assert types[0] == "started" and types[-1] == "final" and "text" in types
    streamed = "".join(event["text"] for event in events if event["type"] == "text")
    assert streamed.split() == reply.split()  # streamed as the adapter yielded it
    final = events[-1]
    assert [m["content"] for m in final["messages"]] == [reply]
    assert final["usage"]["total_tokens"] == final["usage"]["prompt_tokens"] + final["usage"]["completion_tokens"] > 0

    # The second turn's input carries the first turn's two messages as history.
    second = _request(session_id, "again")
    assert (
        execute_turn(second, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime()).outcome
        is Outcome.SUCCEEDED
    )
    assert turn_messages(second.turn_id)[-1].content == "again | history 2 | prompt Be brief."

"""A turn of several tool rounds whose third model request fails resumes after its finished steps.

Run by the in-process worker (tests/support/inprocess.py) with the model stub over HTTP: the
retry after the `AgentInvocationError` asks the model only for what was not finished, each call of
the side-effect tool (`tests.support.effects`) ran once, and the turn stores what a fault-free run
of the same turn stores.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from models.tables import ChatMessage
from tests.support.effects import EFFECT, lines
from tests.support.inprocess import InProcessWorker
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages, wait_for_turns
from worker.producer import create_session, submit_turn
from worker.queries import turn_report

FRAMEWORKS = ("plain_openai", "langgraph")
ROUNDS = 4


def _content(path: Path, key: str, fail_at: int) -> str:
    return f'work [rounds: {ROUNDS} {EFFECT} {{"path": "{path}"}}] [fail-at: {key} {fail_at}]'


def _submit(framework: str, content: str) -> uuid.UUID:
    session_id = create_session(framework=framework, model="gpt-4o-mini", metadata={"tools": [EFFECT]})
    return submit_turn(session_id, content).turn_id


def _shape(messages: list[ChatMessage]) -> list[tuple[Any, ...]]:
    """What two runs must agree on: roles, texts, the tools called and their arguments (ids differ per run)."""
    return [
        (
            m.role,
            m.content,
            [(c["name"], json.dumps(c["args"]).replace("/fault/", "/clean/")) for c in m.tool_calls or ()],
            m.tool_call_id is not None,
        )
        for m in messages
    ]


def _requests(stub: OpenAIStub, key: str) -> list[dict[str, Any]]:
    return [r for r in stub.requests if f"fail-at: {key} " in json.dumps(r.get("messages", []))]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_retried_turn_resumes_after_its_finished_steps_and_stores_what_a_fault_free_run_stores(
    framework: str, in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str, tmp_path: Path
) -> None:
    clean_key, faulty_key = f"clean-{uuid.uuid4().hex}", f"faulty-{uuid.uuid4().hex}"
    # The same words in both (the stub's usage counts them); only the faulty one reaches its 3rd request's fault.
    (tmp_path / "clean").mkdir()
    # Folder names of one length: the stub counts a tool call's characters (its arguments hold the path).
    (tmp_path / "fault").mkdir()
    clean = _submit(framework, _content(tmp_path / "clean" / "out.txt", clean_key, 99))
    faulty = _submit(framework, _content(tmp_path / "fault" / "out.txt", faulty_key, 3))
    rows = wait_for_turns([clean, faulty])
    assert rows[clean].status.value == "succeeded" and rows[clean].attempts == 1
    assert rows[faulty].status.value == "succeeded" and rows[faulty].attempts == 2, rows[faulty].error

    # Each call of the side-effect tool ran exactly once, under its own stable key.
    written = lines(tmp_path / "fault" / "out.txt")
    assert len(written) == ROUNDS and len(set(written)) == ROUNDS
    assert all(line.startswith(f"{faulty}:call_") for line in written)

    # The model was asked only for what was not finished: one request more than a fault-free run
    # (the one that failed), and the retry sent the very conversation the failed request had.
    assert len(_requests(openai_stub, clean_key)) == ROUNDS + 1
    requests = _requests(openai_stub, faulty_key)
    assert len(requests) == ROUNDS + 2
    assert requests[3]["messages"] == requests[2]["messages"]

    # Stored: what the fault-free run stored, each message once, in order, tool call ids intact.
    stored, expected = turn_messages(faulty)[1:], turn_messages(clean)[1:]
    assert _shape(stored) == _shape(expected)
    assert stored[-1].content == f"Done after {ROUNDS} rounds: line {ROUNDS}"
    for call, result in zip(stored[0:-1:2], stored[1:-1:2], strict=True):
        assert call.tool_calls is not None and result.tool_call_id == call.tool_calls[0]["id"]
    assert [f"{faulty}:{m.tool_call_id}" for m in stored if m.role == "tool"] == written
    usage = (rows[faulty].prompt_tokens, rows[faulty].completion_tokens, rows[faulty].total_tokens)
    assert usage == (rows[clean].prompt_tokens, rows[clean].completion_tokens, rows[clean].total_tokens)

    # The stream: one retry saying where the next attempt resumes, then only new events.
    events = replay_events(redis_url, faulty)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    retries = [i for i, e in enumerate(events) if e["type"] == "retry"]
    assert len(retries) == 1
    assert events[retries[0]]["resumed_after"] == 4  # two rounds: a call and its result each
    before = {e["tool"]["id"] for e in events[: retries[0]] if e["type"] == "tool"}
    after = [e["tool"] for e in events[retries[0] :] if e["type"] == "tool"]
    assert len(before) == 2 and not before & {tool["id"] for tool in after}
    assert [tool["status"] for tool in after] == ["started", "finished"] * 2
    assert [m["content"] for m in events[-1]["messages"]] == [m.content for m in stored]

    # `chatq show` / GET /turns/{id}: the steps and the attempt that did each.
    steps = turn_report(faulty)["steps"]
    finished = [(s["kind"], s["attempt"]) for s in steps if s["kind"] != "tool_started"]
    assert finished == [("model", 1), ("tool_result", 1)] * 2 + [("model", 2), ("tool_result", 2)] * 2

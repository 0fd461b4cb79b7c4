"""A turn whose model calls a tool that needs approval pauses (`awaiting_approval`), holding nothing,
and resumes from its journal once a person decides: the call runs once (as made, or with edited
arguments) or the model reads that it was denied; nothing before the pause is asked of the model again."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.approvals.conftest import APPROVED
from tests.support.effects import EFFECT, lines
from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages, wait_for_status, wait_for_turn
from worker.errors import ApprovalConflict, ApprovalExpired, InvalidTurn, SessionBusy
from worker.producer import (
    cancel_turn,
    create_session,
    decide_tool_call,
    pending_approvals,
    submit_turn,
    update_session,
)
from worker.runtime.recovery.sweeper import time_out_approvals

FRAMEWORKS = ("plain_openai", "langgraph")


def _requests(stub: OpenAIStub, key: str) -> list[dict[str, Any]]:
    return [r for r in stub.requests if key in json.dumps(r.get("messages", []))]


def _pause(framework: str, path: Path, **session: Any) -> tuple[uuid.UUID, str, str]:
    """Submit a turn whose model calls `effect_approved` once; wait for the pause; (turn, call id, key)."""
    key = f"approve-{uuid.uuid4().hex}"
    session.setdefault("metadata", {"tools": [APPROVED]})
    session_id = create_session(framework=framework, model="gpt-4o-mini", **session)
    content = f'{key} [rounds: 1 {APPROVED} {{"path": "{path}"}}]'
    turn_id = submit_turn(session_id, content).turn_id
    wait_for_status(turn_id, "awaiting_approval")
    [waiting] = [p for p in pending_approvals() if p["turn_id"] == str(turn_id)]
    [call] = waiting["calls"]
    assert call["name"] == APPROVED and call["args"] == {"path": str(path)}
    return turn_id, call["id"], key


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_approved_call_runs_once_after_the_pause_and_the_model_is_not_asked_again_for_what_came_before(
    framework: str, in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    turn_id, call_id, key = _pause(framework, out)
    # Paused: nothing ran, one model request was made, and the stream says what waits until when.
    assert lines(out) == [] and len(_requests(openai_stub, key)) == 1
    events = replay_events(redis_url, turn_id)
    [required] = [e for e in events if e["type"] == "approval_required"]
    assert required["calls"] == [{"id": call_id, "name": APPROVED, "args": {"path": str(out)}}]
    assert required["until"] > time.time() + 3600

    decided = decide_tool_call(turn_id, call_id, approve=True)
    assert decided.resumed
    row = wait_for_turn(turn_id)
    assert row.status.value == "succeeded", row.error
    assert lines(out) == [f"{turn_id}:{call_id}"]
    requests = _requests(openai_stub, key)
    assert len(requests) == 2  # the one before the pause, and the one after the result
    assert requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": call_id, "content": "line 1"}
    stored = turn_messages(turn_id)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[-1].content == "Done after 1 rounds: line 1"
    assert [e["type"] for e in replay_events(redis_url, turn_id)][-1] == "final"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_approve_with_edited_args_runs_the_call_with_them_and_refuses_args_the_schema_refuses(
    framework: str, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    asked, edited = tmp_path / "asked.txt", tmp_path / "edited.txt"
    turn_id, call_id, _ = _pause(framework, asked)
    with pytest.raises(InvalidTurn, match="unknown argument 'nope'"):
        decide_tool_call(turn_id, call_id, approve=True, args={"path": str(edited), "nope": 1})
    with pytest.raises(InvalidTurn, match="argument 'path' must be string"):
        decide_tool_call(turn_id, call_id, approve=True, args={"path": 3})
    decide_tool_call(turn_id, call_id, approve=True, args={"path": str(edited)})
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert lines(asked) == [] and lines(edited) == [f"{turn_id}:{call_id}"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_denied_call_does_not_run_and_the_model_reads_why(
    framework: str, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    turn_id, call_id, key = _pause(framework, out)
    decide_tool_call(turn_id, call_id, approve=False, reason="not on a Friday")
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert lines(out) == []
    requests = _requests(openai_stub, key)
    assert len(requests) == 2
    result = requests[1]["messages"][-1]
    assert result["role"] == "tool" and result["tool_call_id"] == call_id
    assert "denied" in result["content"] and "not on a Friday" in result["content"]


def test_a_second_decision_on_a_call_is_a_conflict(
    in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    turn_id, call_id, _ = _pause("plain_openai", tmp_path / "out.txt")
    with pytest.raises(ApprovalConflict):
        decide_tool_call(turn_id, "no-such-call", approve=True)
    decide_tool_call(turn_id, call_id, approve=True)
    with pytest.raises(ApprovalConflict):
        decide_tool_call(turn_id, call_id, approve=False, reason="changed my mind")
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert lines(tmp_path / "out.txt") == [f"{turn_id}:{call_id}"]


def test_past_the_deadline_a_decision_is_gone_and_the_sweep_denies_the_call_as_timed_out(
    in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    turn_id, call_id, key = _pause("plain_openai", out, metadata={"tools": [APPROVED], "approval_timeout": 0.5})
    time.sleep(0.8)
    with pytest.raises(ApprovalExpired):
        decide_tool_call(turn_id, call_id, approve=True)
    assert time_out_approvals(build_runtime()) == 1
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert lines(out) == []
    assert "timed out" in _requests(openai_stub, key)[-1]["messages"][-1]["content"]
    with pytest.raises(ApprovalExpired):  # after the sweep too: gone, not a conflict
        decide_tool_call(turn_id, call_id, approve=True)


def test_a_paused_turn_holds_its_sessions_place_counts_as_busy_and_can_be_cancelled(
    in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    key = f"approve-{uuid.uuid4().hex}"
    session_id = create_session(framework="plain_openai", model="gpt-4o-mini", metadata={"tools": [APPROVED]})
    paused = submit_turn(session_id, f'{key} [rounds: 1 {APPROVED} {{"path": "{tmp_path / "x"}"}}]').turn_id
    wait_for_status(paused, "awaiting_approval")
    with pytest.raises(SessionBusy):
        submit_turn(session_id, "and then?", if_busy="reject")
    later = submit_turn(session_id, f"{key} later").turn_id
    time.sleep(1.0)
    wait_for_status(later, "queued")  # waits behind the paused turn, as behind a running one
    wait_for_status(paused, "awaiting_approval")
    [waiting] = [p for p in pending_approvals() if p["turn_id"] == str(paused)]
    assert cancel_turn(paused).status.value == "cancelled"
    assert wait_for_turn(later).status.value == "succeeded"
    # A decision that comes after the cancel is a conflict and runs nothing.
    with pytest.raises(ApprovalConflict):
        decide_tool_call(paused, waiting["calls"][0]["id"], approve=True)
    assert wait_for_turn(paused).status.value == "cancelled"
    assert lines(tmp_path / "x") == []


def test_a_paused_turn_survives_redis_losing_everything_and_a_later_decision_resumes_it(
    in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str, tmp_path: Path
) -> None:
    import redis

    out = tmp_path / "out.txt"
    turn_id, call_id, _ = _pause("langgraph", out)
    client = redis.Redis.from_url(redis_url)  # the test's own db (the fixture reserved it)
    try:
        client.flushdb()
    finally:
        client.close()
    decide_tool_call(turn_id, call_id, approve=True)
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert lines(out) == [f"{turn_id}:{call_id}"]


def test_the_session_policy_is_validated_and_applies_to_tools_that_do_not_ask(
    in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    with pytest.raises(InvalidTurn, match="approval must be none, paid, all or a list of tool names"):
        create_session(framework="plain_openai", approval="sometimes")
    session_id = create_session(framework="plain_openai", model="gpt-4o-mini", metadata={"tools": [EFFECT]})
    assert update_session(session_id, approval=[EFFECT])["metadata"]["approval"] == [EFFECT]
    out = tmp_path / "out.txt"
    turn_id = submit_turn(session_id, f'go [rounds: 1 {EFFECT} {{"path": "{out}"}}]').turn_id
    wait_for_status(turn_id, "awaiting_approval")
    [waiting] = [p for p in pending_approvals() if p["turn_id"] == str(turn_id)]
    decide_tool_call(turn_id, waiting["calls"][0]["id"], approve=True)
    assert wait_for_turn(turn_id).status.value == "succeeded"
    assert len(lines(out)) == 1


def test_the_command_line_lists_approves_and_denies(
    in_process: InProcessWorker, openai_stub: OpenAIStub, chatq_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.support.cli import chatq_here

    out = tmp_path / "out.txt"
    turn_id, call_id, _ = _pause("plain_openai", out)
    listed = chatq_here(chatq_env, "pending")
    assert listed.returncode == 0 and f"{turn_id}  {call_id}  {APPROVED}" in listed.stdout
    refused = chatq_here(chatq_env, "approve", str(turn_id), call_id, "--args", "[1]")
    assert refused.returncode != 0 and "--args must be a JSON object" in refused.stderr
    approved = chatq_here(chatq_env, "approve", str(turn_id))
    assert approved.returncode == 0, approved.stderr
    assert "the turn resumes" in approved.stdout
    assert wait_for_turn(turn_id).status.value == "succeeded"
    again = chatq_here(chatq_env, "deny", str(turn_id), call_id, "--reason", "late")
    assert again.returncode != 0 and "not awaiting approval" in again.stderr
    assert len(lines(out)) == 1

"""Tool approvals (issue 29) with real workers, both tool-calling adapters.

One worker pauses every turn of the module (two per framework, each calling the side-effect tool
its session's `approval` policy names):

- a person approves the first pair with edited arguments: each turn ends on that worker, the
  tool ran once with the edited arguments, and the model was asked nothing twice;
- the worker is then killed (-9) while the second pair waits, the test's Redis db loses everything
  (FLUSHDB), a fresh worker starts, and only then is the second pair approved: each resumes from
  Postgres on the new worker and ends once (the tool ran once, each message stored once, the
  stream's events numbered without a gap).

Deny, the deadline, a second decision and cancel are covered in-process (tests/integration/approvals).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.faults.durable import FRAMEWORKS, wait_until
from tests.faults.helpers import STUB_MODEL, Worker, Workers, load_turns, wait_finished
from tests.support.effects import EFFECT, effect_tools, lines
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.approvals import decide_tool_call, pending_approvals
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

WORKER_ENV = {"CHATQ_PLUGINS": "tests.support.effects"}
"""The side-effect tools in every worker (this process registers them with `effect_tools()`)."""
FINISH = 60.0
"""Generous bound for a turn to pause, or to end after its decision, on a loaded machine."""


@dataclass(frozen=True, kw_only=True)
class Paused:
    """A turn of one round of the side-effect tool, waiting for a decision on its call."""

    turn_id: uuid.UUID
    """The turn."""
    key: str
    """The key of its model requests (`requests_of`)."""
    path: Path
    """The file the call the model made would append to."""
    call_id: str
    """The waiting call."""


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A paused turn after its decision: what the test asserts on."""

    case: Paused
    """The turn as it paused."""
    edited: Path
    """The file the approved (edited) arguments name."""
    worker: Worker
    """The worker that ran it after the decision."""
    events: list[dict[str, Any]]
    """Its stream's events, read once it ended."""


@pytest.fixture(scope="module", autouse=True)
def _effects() -> Iterator[None]:
    """The side-effect tools exist in this process too (the decision checks edited arguments against them)."""
    with effect_tools():
        yield


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("approvals")


def _submit(framework: str, tmp: Path) -> tuple[uuid.UUID, str, Path]:
    key, path = uuid.uuid4().hex, tmp / f"{uuid.uuid4().hex[:12]}.txt"
    session_id = create_session(framework=framework, model=STUB_MODEL, metadata={"tools": [EFFECT]}, approval=[EFFECT])
    turn_id = submit_turn(session_id, f'#{key} [rounds: 1 {EFFECT} {{"path": "{path}"}}]').turn_id
    return turn_id, key, path


def _paused(submitted: list[tuple[uuid.UUID, str, Path]], pool: Workers) -> list[Paused]:
    """Wait until every submitted turn waits for its call; the cases, in the same order."""
    ids = {str(turn_id) for turn_id, _, _ in submitted}

    def waiting() -> dict[str, dict[str, Any]]:
        return {p["turn_id"]: p for p in pending_approvals(limit=1000) if p["turn_id"] in ids}

    wait_until(lambda: len(waiting()) == len(ids), "the turns did not all pause", timeout=FINISH, logs=pool.logs)
    found = waiting()
    cases = []
    for turn_id, key, path in submitted:
        [call] = found[str(turn_id)]["calls"]
        assert call["name"] == EFFECT and call["args"] == {"path": str(path)}
        cases.append(Paused(turn_id=turn_id, key=key, path=path, call_id=call["id"]))
    return cases


def _approve_edited(cases: list[Paused], tmp: Path) -> dict[uuid.UUID, Path]:
    """Approve each case's call with the path changed; the edited paths by turn."""
    edited = {}
    for case in cases:
        edited[case.turn_id] = tmp / f"edited-{case.turn_id}.txt"
        decided = decide_tool_call(case.turn_id, case.call_id, approve=True, args={"path": str(edited[case.turn_id])})
        assert decided.resumed
    return edited


@pytest.fixture(scope="module")
def scenario(worker_env: dict[str, str], tmp: Path, redis_url: str) -> Iterator[dict[str, dict[str, Ended]]]:
    """By framework: `approved` (on the first worker), `after_flush` (on a fresh one after kill -9 and FLUSHDB)."""
    pool = Workers(worker_env)
    try:
        first = pool.one(concurrency=4, env=WORKER_ENV)
        submitted = {name: [_submit(f, tmp) for f in FRAMEWORKS] for name in ("approved", "after_flush")}
        cases = {name: _paused(turns, pool) for name, turns in submitted.items()}
        rows = load_turns(c.turn_id for name in cases for c in cases[name]).values()
        assert {(row.status.value, row.lease_token) for row in rows} == {("awaiting_approval", None)}

        edited = {"approved": _approve_edited(cases["approved"], tmp)}
        wait_finished([c.turn_id for c in cases["approved"]], timeout=FINISH)
        events = {c.turn_id: replay_events(redis_url, c.turn_id) for c in cases["approved"]}  # before the flush

        # The second pair still waits: kill -9 the worker that paused them, lose everything in Redis.
        first.kill()
        client = redis.Redis.from_url(redis_url)  # the test run's own db (tests/conftest.py reserved it)
        try:
            client.flushdb()
            assert client.dbsize() == 0
        finally:
            client.close()
        fresh = pool.one(concurrency=4, env=WORKER_ENV)
        edited["after_flush"] = _approve_edited(cases["after_flush"], tmp)
        wait_finished([c.turn_id for c in cases["after_flush"]], timeout=FINISH)
        events.update({c.turn_id: replay_events(redis_url, c.turn_id) for c in cases["after_flush"]})

        yield {
            name: {
                framework: Ended(
                    case=case,
                    edited=edited[name][case.turn_id],
                    worker=first if name == "approved" else fresh,
                    events=events[case.turn_id],
                )
                for framework, case in zip(FRAMEWORKS, cases[name], strict=True)
            }
            for name in cases
        }
    finally:
        pool.kill_all()
        print(pool.logs())  # shown only when a test failed


def _assert_ran_once_with_the_edited_args(ended: Ended, stub: OpenAIStub) -> None:
    case = ended.case
    row = load_turns([case.turn_id])[case.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(ended.worker.hostname_prefix)
    # The call ran once, under its own key, with the edited arguments; the model's path was never written.
    assert lines(ended.edited) == [f"{case.turn_id}:{case.call_id}"]
    assert lines(case.path) == []
    # Two model requests: the one that asked for the call, and the one after its result. Nothing
    # before the pause was asked again.
    requests = [body for body in stub.requests if case.key in json.dumps(body.get("messages"))]
    assert len(requests) == 2, [r["messages"][-1] for r in requests]
    first, second = requests
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": case.call_id, "content": "line 1"}
    # Each message stored once.
    stored = [(m.role, m.content, m.tool_call_id) for m in turn_messages(case.turn_id)]
    assert [role for role, _, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2] == ("tool", "line 1", case.call_id) and stored[3][1] == "Done after 1 rounds: line 1"


def _finished_calls(events: list[dict[str, Any]]) -> list[str]:
    return [e["tool"]["id"] for e in events if e["type"] == "tool" and e["tool"]["status"] == "finished"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_approved_with_edited_args_the_turn_ends_and_the_call_ran_once_with_them(
    framework: str, scenario: dict[str, dict[str, Ended]], openai_stub: OpenAIStub
) -> None:
    ended = scenario["approved"][framework]
    _assert_ran_once_with_the_edited_args(ended, openai_stub)
    # The stream as it was sent: paused, resumed, ended once, numbered without a gap.
    types = [e["type"] for e in ended.events]
    pause = types.index("approval_required")
    assert types[:2] == ["queued", "started"] and types[pause + 1] == "started", types
    assert _finished_calls(ended.events[:pause]) == [] and _finished_calls(ended.events) == [ended.case.call_id]
    assert types.count("approval_required") == 1 and types.count("final") == 1 and types[-1] == "final", types
    assert [e["seq"] for e in ended.events] == list(range(1, len(ended.events) + 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_turn_paused_through_kill_9_and_a_redis_flush_resumes_on_a_fresh_worker_once(
    framework: str, scenario: dict[str, dict[str, Ended]], openai_stub: OpenAIStub
) -> None:
    ended = scenario["after_flush"][framework]
    _assert_ran_once_with_the_edited_args(ended, openai_stub)
    # Redis lost the events before the flush; what the resumed attempt published is whole.
    types = [e["type"] for e in ended.events]
    assert types[0] == "started" and types.count("started") == 1, types
    assert types.count("final") == 1 and types[-1] == "final" and "approval_required" not in types
    assert _finished_calls(ended.events) == [ended.case.call_id]
    seqs = [e["seq"] for e in ended.events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

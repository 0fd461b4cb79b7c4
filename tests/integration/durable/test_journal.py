"""The journal's rules, each from a journal written as an interrupted attempt would have left it.

An earlier attempt is played by claiming the turn, writing its steps (`worker.store.journal`) and
handing the turn back; the next attempt runs through `execute_turn` in this process, against the
real Postgres and Redis and the model stub over HTTP.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chatq.settings import get_settings, reset_settings
from handlers.errors import StepNotRecorded
from handlers.journal import StepKind
from handlers.messages import AgentMessage
from models.db import get_engine
from tests.support.effects import EFFECT, EFFECT_REPEATABLE, lines
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.handlers import PORTED_FRAMEWORKS, PORTED_PLUGIN, plugin_installed
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.deletion import delete_session
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session, submit_turn
from worker.runtime.delivery.runner import Outcome, Result, execute_turn
from worker.store.claims import claim_turn, requeue_turn
from worker.store.journal import TurnJournal, read_steps

FRAMEWORKS = ("plain_openai", "langgraph")
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.fixture
def stub(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """Settings of a worker that talks to the stub (no retry delay); the stub's records start empty."""
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


def _calls(path: Path, name: str, *ids: str) -> AgentMessage:
    calls = [{"id": call_id, "name": name, "args": {"path": str(path)}} for call_id in ids]
    return AgentMessage(role="assistant", content="", tool_calls=calls)


def _interrupted(framework: str, content: str, steps: Callable[[TurnJournal], None]) -> TurnRequest:
    """A turn whose first attempt wrote `steps` and then stopped (the turn handed back, queued again)."""
    session_id = create_session(
        framework=framework, model="gpt-4o-mini", metadata={"tools": [EFFECT, EFFECT_REPEATABLE]}
    )
    turn_id = submit_turn(session_id, content).turn_id
    claim = claim_turn(turn_id, worker="earlier@test", engine=get_engine(), settings=get_settings()).claim
    assert claim is not None
    journal = TurnJournal.open(get_engine(), turn_id=turn_id, lease_token=claim.lease_token, attempt=claim.attempt)
    steps(journal)
    assert requeue_turn(claim, engine=get_engine(), hand_back=True)
    return parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(turn_id), settings=get_settings()
    )


def _run(request: TurnRequest) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())


@pytest.mark.usefixtures("chatq_env")
def test_a_stale_attempt_cannot_write_the_journal() -> None:
    session_id = create_session(framework="plain_openai", model="gpt-4o-mini")
    turn_id = submit_turn(session_id, "hello").turn_id
    first = claim_turn(turn_id, worker="w1", engine=get_engine(), settings=get_settings()).claim
    assert first is not None
    stale = TurnJournal.open(get_engine(), turn_id=turn_id, lease_token=first.lease_token, attempt=first.attempt)
    stale.model_step(_calls(Path("/dev/null"), EFFECT, "call_a"), USAGE)
    assert requeue_turn(first, engine=get_engine(), hand_back=True)
    second = claim_turn(turn_id, worker="w2", engine=get_engine(), settings=get_settings()).claim
    assert second is not None
    current = TurnJournal.open(get_engine(), turn_id=turn_id, lease_token=second.lease_token, attempt=second.attempt)
    assert [step.kind for step in current.done] == [StepKind.MODEL]
    assert current.done[0].message == _calls(Path("/dev/null"), EFFECT, "call_a") and current.done[0].usage == USAGE

    with pytest.raises(StepNotRecorded) as refused:
        stale.tool_started("call_a", EFFECT)
    assert refused.value.stale
    current.tool_started("call_a", EFFECT)
    with get_engine().connect() as db:
        assert [(s.seq, s.kind) for s in read_steps(db, turn_id)] == [(1, StepKind.MODEL), (2, StepKind.TOOL_STARTED)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_started_call_of_a_tool_not_safe_to_repeat_fails_the_turn_naming_the_call(
    framework: str, stub: OpenAIStub, tmp_path: Path
) -> None:
    path = tmp_path / "out.txt"

    def steps(journal: TurnJournal) -> None:
        journal.model_step(_calls(path, EFFECT, "call_unsure"), USAGE)
        journal.tool_started("call_unsure", EFFECT)

    request = _interrupted(framework, "[quote] go", steps)
    result = _run(request)
    # No retry: running the handler again could not tell either.
    assert (result.outcome, result.attempt) == (Outcome.FAILED, 1)
    assert result.error is not None and "call_unsure" in result.error and EFFECT in result.error
    assert "unknown" in result.error
    assert lines(path) == [] and stub.requests == []
    assert [m.role for m in turn_messages(request.turn_id)] == ["user"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_repeatable_call_repeats_with_its_key_and_a_recorded_result_is_not_run_again(
    framework: str, stub: OpenAIStub, tmp_path: Path, redis_url: str
) -> None:
    path = tmp_path / "out.txt"

    def steps(journal: TurnJournal) -> None:
        journal.model_step(_calls(path, EFFECT_REPEATABLE, "call_one", "call_two"), USAGE)
        journal.tool_started("call_one", EFFECT_REPEATABLE)
        journal.tool_finished(
            "call_one", AgentMessage(role="tool", content="recorded earlier", tool_call_id="call_one")
        )
        journal.tool_started("call_two", EFFECT_REPEATABLE)

    request = _interrupted(framework, "[quote] go", steps)
    result = _run(request)
    assert result.outcome is Outcome.SUCCEEDED, result.error
    # Only the call without a recorded result ran, under the key every attempt gives it.
    assert lines(path) == [f"{request.turn_id}:call_two"]
    stored = [(m.role, m.content, m.tool_call_id) for m in turn_messages(request.turn_id)]
    assert stored == [
        ("user", "[quote] go", None),
        ("assistant", "", None),
        ("tool", "recorded earlier", "call_one"),
        ("tool", "line 1", "call_two"),
        ("assistant", "From the sources: line 1", None),
    ]
    # The model was asked once, after both results; the recorded request's usage counts with its own.
    assert len(stub.replies) == 1
    total = USAGE["total_tokens"] + stub.replies[0]["usage"]["total_tokens"]
    calls = turn_messages(request.turn_id)[1].tool_calls
    assert calls is not None and [call["id"] for call in calls] == ["call_one", "call_two"]
    events = replay_events(redis_url, request.turn_id)
    assert [e["usage"]["total_tokens"] for e in events if e["type"] == "final"] == [total]
    # Only the call that ran now streams tool events.
    assert [(e["tool"]["id"], e["tool"]["status"]) for e in events if e["type"] == "tool"] == [
        ("call_two", "started"),
        ("call_two", "finished"),
    ]


@pytest.mark.parametrize("framework", PORTED_FRAMEWORKS)
def test_a_handler_written_to_the_public_contract_starts_over_and_records_nothing(
    framework: str, stub: OpenAIStub, redis_url: str
) -> None:
    with plugin_installed(PORTED_PLUGIN, *PORTED_FRAMEWORKS):
        session_id = create_session(framework=framework)
        request = parse_turn_request(
            {"session_id": str(session_id), "content": "[fail]"}, task_id=str(uuid.uuid4()), settings=get_settings()
        )
        assert _run(request).outcome is Outcome.RETRY
        assert _run(request).outcome is Outcome.FAILED
    with get_engine().connect() as db:
        assert read_steps(db, request.turn_id) == []
    retries = [e for e in replay_events(redis_url, request.turn_id) if e["type"] == "retry"]
    assert len(retries) == 1 and "resumed_after" not in retries[0]


@pytest.mark.usefixtures("chatq_env")
def test_deleting_the_session_removes_the_journal(tmp_path: Path) -> None:
    def steps(journal: TurnJournal) -> None:
        journal.model_step(_calls(tmp_path / "out.txt", EFFECT, "call_a"), USAGE)
        journal.tool_started("call_a", EFFECT)

    request = _interrupted("plain_openai", "go", steps)
    with get_engine().connect() as db:
        assert len(read_steps(db, request.turn_id)) == 2
    delete_session(request.session_id)
    with get_engine().connect() as db:
        assert read_steps(db, request.turn_id) == []
        turns = db.exec_driver_sql("SELECT count(*) FROM turns WHERE id = %s", (request.turn_id,)).scalar_one()
    assert turns == 0

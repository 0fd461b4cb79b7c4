"""A raw task message (another language's producer: no `submit_turn`, the worker stores the session,
turn and user message at the claim) stores what the producer API stores, once.

Run in this process with `execute_turn` against the real Postgres and Redis and the model stub.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import DateTime, Table, select

from chatq.settings import get_settings, reset_settings
from models.db import session_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session, submit_turn
from worker.runtime.delivery.runner import Outcome, Result, execute_turn

WORKER = "in-process@test"
IDS = {"id", "session_id", "turn_id", "lease_token"}
"""Columns that differ between any two turns (their ids); timestamps are left out by type."""


@pytest.fixture
def runtime(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


def _raw(session_id: uuid.UUID, content: str, turn_id: uuid.UUID | None = None, **more: Any) -> TurnRequest:
    """A raw producer's message, parsed as the task body parses it."""
    kwargs = {"session_id": str(session_id), "content": content, **more}
    return parse_turn_request(kwargs, task_id=str(turn_id or uuid.uuid4()), settings=get_settings())


def _run(request: TurnRequest) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker=WORKER, runtime=build_runtime())


def _rows(session_id: uuid.UUID) -> dict[str, Any]:
    """Everything stored for a session, ids and timestamps left out."""

    def values(row: Any) -> dict[str, Any]:
        table: Table = row.__table__
        return {
            column.key: getattr(row, column.key)
            for column in table.columns
            if column.name not in IDS and not isinstance(column.type, DateTime)
        }

    with session_scope() as db:
        session = db.get(ChatSession, session_id)
        assert session is not None
        turns = db.execute(select(Turn).where(Turn.session_id == session_id).order_by(Turn.position)).scalars()
        messages = db.execute(
            select(ChatMessage).where(ChatMessage.session_id == session_id).order_by(ChatMessage.position)
        ).scalars()
        return {
            "session": {k: v for k, v in values(session).items() if k != "metadata_"} | {"metadata": session.metadata_},
            "turns": [values(turn) for turn in turns],
            "messages": [{k: v for k, v in values(m).items() if k != "reply_to"} for m in messages],
        }


def _counts(session_id: uuid.UUID) -> tuple[int, int]:
    rows = _rows(session_id)
    return len(rows["turns"]), len(rows["messages"])


def test_a_raw_messages_turns_are_stored_as_the_apis(runtime: OpenAIStub) -> None:
    # The API's session as a raw message's is made: the defaults (langgraph, the worker's model).
    api_session = create_session(framework="langgraph")
    for content in ("hello [words: 3]", "again [words: 2]"):
        turn = submit_turn(api_session, content)
        assert _run(_raw(api_session, content, turn.turn_id)).outcome is Outcome.SUCCEEDED
    raw_session = uuid.uuid4()
    for content in ("hello [words: 3]", "again [words: 2]"):
        assert _run(_raw(raw_session, content)).outcome is Outcome.SUCCEEDED

    api, raw = _rows(api_session), _rows(raw_session)
    assert [t["position"] for t in raw["turns"]] == [0, 1] and raw["session"]["next_turn_position"] == 2
    assert len(raw["messages"]) == 4
    assert raw == api


def test_a_redelivered_raw_message_does_nothing_twice(runtime: OpenAIStub) -> None:
    session_id = uuid.uuid4()
    request = _raw(session_id, "once [words: 2]")
    assert _run(request).outcome is Outcome.SUCCEEDED
    stored, calls = _rows(session_id), len(runtime.requests)

    assert _run(request).outcome is Outcome.SKIPPED
    assert _rows(session_id) == stored and len(runtime.requests) == calls


def test_a_raw_message_delivered_twice_at_once_runs_and_stores_once(runtime: OpenAIStub) -> None:
    session_id = uuid.uuid4()
    request = _raw(session_id, "twice [words: 2]")
    start = threading.Barrier(2)
    outcomes: list[Outcome] = []

    def deliver() -> None:
        start.wait()
        outcomes.append(_run(request).outcome)

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcomes.count(Outcome.SUCCEEDED) == 1, outcomes
    assert set(outcomes) <= {Outcome.SUCCEEDED, Outcome.SKIPPED, Outcome.BUSY}, outcomes
    assert _counts(session_id) == (1, 2)
    assert sum("twice" in str(body) for body in runtime.requests) == 1


def test_raw_messages_for_one_new_session_at_once_store_one_session_in_order(runtime: OpenAIStub) -> None:
    session_id = uuid.uuid4()
    requests = [_raw(session_id, f"turn {i} [words: 1]") for i in range(4)]
    start = threading.Barrier(len(requests))
    results: dict[uuid.UUID, Outcome] = {}

    def deliver(request: TurnRequest) -> None:
        start.wait()
        results[request.turn_id] = _run(request).outcome

    threads = [threading.Thread(target=deliver, args=(request,)) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    rows = _rows(session_id)
    # Every turn stored once, at its own position, each with its user message.
    assert sorted(t["position"] for t in rows["turns"]) == [0, 1, 2, 3]
    assert rows["session"]["next_turn_position"] == 4
    users = sorted(m["position"] for m in rows["messages"] if m["role"] == "user")
    assert users == [p * MESSAGE_POSITION_STRIDE for p in range(4)]
    assert len(results) == 4


def test_a_raw_reply_to_for_a_new_session_is_refused_and_stores_nothing(runtime: OpenAIStub) -> None:
    session_id = uuid.uuid4()
    request = _raw(session_id, "hello", reply_to=12345)
    assert _run(request).outcome is Outcome.FAILED
    with session_scope() as db:
        assert db.get(ChatSession, session_id) is None
        assert db.get(Turn, request.turn_id) is None
    assert not any("hello" in str(body) for body in runtime.requests)


def test_a_raw_message_naming_another_sessions_turn_stores_nothing(runtime: OpenAIStub) -> None:
    owner = _raw(uuid.uuid4(), "mine [words: 1]")
    assert _run(owner).outcome is Outcome.SUCCEEDED
    stranger = uuid.uuid4()
    assert _run(_raw(stranger, "yours", owner.turn_id)).outcome is Outcome.FAILED
    with session_scope() as db:
        assert db.get(ChatSession, stranger) is None, "no session made for a refused message"
    assert _counts(owner.session_id) == (1, 2)


def test_a_message_of_a_stored_turn_the_claim_does_not_take_is_answered_as_claim_turn(runtime: OpenAIStub) -> None:
    from models.db import get_engine
    from worker.producer import cancel_turn
    from worker.store.claims import ClaimStatus, claim_message, claim_turn

    def claim(turn_id: uuid.UUID, session_id: uuid.UUID, how: Any) -> Any:
        if how is claim_turn:
            return claim_turn(
                turn_id, worker="x@b", session_id=session_id, engine=get_engine(), settings=get_settings()
            )
        request = _raw(session_id, "copy", turn_id)
        return claim_message(
            request, queue=INTERACTIVE_QUEUE, worker="x@b", engine=get_engine(), settings=get_settings()
        )

    sid, other = create_session(framework="langgraph"), create_session(framework="langgraph")
    running = submit_turn(sid, "runs").turn_id
    assert claim_turn(running, worker="w@a", engine=get_engine(), settings=get_settings()).claim is not None
    blocked = submit_turn(sid, "after it").turn_id
    finished = submit_turn(other, "cancelled").turn_id
    cancel_turn(finished)
    cases = [
        (blocked, other, ClaimStatus.CONFLICT),
        (finished, other, ClaimStatus.FINISHED),
        (running, sid, ClaimStatus.BUSY),
        (blocked, sid, ClaimStatus.BLOCKED),
    ]
    for turn_id, session_id, status in cases:
        before = _rows(sid), _rows(other)
        for how in (claim_turn, claim_message):
            result = claim(turn_id, session_id, how)
            assert (result.status, result.claim) == (status, None), how.__name__
            assert (_rows(sid), _rows(other)) == before, f"{how.__name__} wrote on {status}"

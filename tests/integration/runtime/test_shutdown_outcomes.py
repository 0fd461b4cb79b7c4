"""A turn that would start once the worker's warm shutdown began goes back to the queue instead.

Issue 34: turns that started during a warm shutdown ran (or began running) instead of going
straight back. The delivery here checks the shutdown before its claim; the shutdown begins while
the claim waits on the session's row lock (held by this test), as it does under load.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import select, text

from chatq.settings import reset_settings
from models.db import session_scope
from models.tables import ChatSession, Turn, TurnStatus
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events
from worker.payload import INTERACTIVE_QUEUE, TurnRequest
from worker.producer import create_session, submit_turn
from worker.runtime.delivery.runner import Outcome, Result, execute_turn
from worker.runtime.recovery import leases


@pytest.fixture
def stub(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY):
        reset_settings()
        yield openai_stub
    reset_settings()


@pytest.fixture
def shutdown() -> Iterator[None]:
    """This process begins a warm shutdown during the test (and is running again after it)."""
    yield
    leases._hand_back.clear()


def _claim_waiting() -> bool:
    with session_scope() as db:
        waiting = db.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%claimed AS%'")
        ).scalar_one()
    return bool(waiting)


def test_a_turn_claimed_as_the_shutdown_begins_goes_back_before_it_starts(
    stub: OpenAIStub, shutdown: None, redis_url: str
) -> None:
    session_id = create_session(framework="langgraph", model="gpt-4o-mini")
    turn = submit_turn(session_id, "hello")
    client = redis.Redis.from_url(redis_url)
    client.delete(INTERACTIVE_QUEUE)
    request = TurnRequest(turn_id=turn.turn_id, session_id=session_id, content="hello")
    result: list[Result] = []
    with session_scope() as db:
        db.execute(select(ChatSession.id).where(ChatSession.id == session_id).with_for_update())
        delivery = threading.Thread(
            target=lambda: result.append(
                execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())
            )
        )
        delivery.start()
        deadline = time.monotonic() + 10
        while not _claim_waiting():
            assert time.monotonic() < deadline, "the claim never waited on the session's lock"
            time.sleep(0.02)
        leases.begin_hand_back()
    delivery.join(30)

    assert [r.outcome for r in result] == [Outcome.HANDED_BACK]
    assert [e["type"] for e in replay_events(redis_url, turn.turn_id)] == ["queued"]  # never started
    assert stub.requests == []  # the model was never asked
    with session_scope() as db:
        row = db.get(Turn, turn.turn_id)
        assert row is not None and row.status is TurnStatus.QUEUED and row.attempts == 0 and row.deliveries == 0
    queued = [json.loads(raw)["headers"]["id"] for raw in client.lrange(INTERACTIVE_QUEUE, 0, -1)]
    assert queued == [str(turn.turn_id)]  # sent again at once, for another worker
    client.close()

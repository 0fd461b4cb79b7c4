"""A message without chatq's header (`worker.dispatch.STORED_HEADER`, a raw producer's) is stored
before its claim, sparing the claim statement's certain miss; chatq's own messages carry the header.
Against the real Postgres and Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import event

from chatq.settings import get_settings
from models.db import get_engine
from worker.dispatch import STORED_HEADER
from worker.payload import INTERACTIVE_QUEUE, TurnRequest
from worker.producer import create_session, submit_turn
from worker.store.claims import ClaimStatus, claim_message

pytestmark = pytest.mark.usefixtures("chatq_env")


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []
    engine = get_engine()

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def _kinds(statements: list[str]) -> list[str]:
    """Which statements ran, by name (as sent, bind parameters are in the driver's style)."""
    marks = {"ENSURE_TURN": "A delivered message whose turn", "FAST_CLAIM": "set_config('synchronous_commit'"}
    return [next((name for name, mark in marks.items() if mark in text), "other") for text in statements]


def _claim(request: TurnRequest, *, stored: bool) -> ClaimStatus:
    result = claim_message(
        request, queue=INTERACTIVE_QUEUE, worker="w", engine=get_engine(), settings=get_settings(), stored=stored
    )
    return result.status


def test_a_raw_message_is_stored_then_claimed_without_a_miss_first(statements: list[str]) -> None:
    request = TurnRequest(turn_id=uuid.uuid4(), session_id=uuid.uuid4(), content="hello")
    assert _claim(request, stored=False) is ClaimStatus.CLAIMED
    assert _kinds(statements) == ["ENSURE_TURN", "FAST_CLAIM"]


def test_a_message_without_the_header_whose_turn_is_stored_is_still_claimed(statements: list[str]) -> None:
    session_id = create_session(framework="none", model="echo")
    turn = submit_turn(session_id, "hello")
    statements.clear()
    request = TurnRequest(turn_id=turn.turn_id, session_id=session_id, content="hello")
    assert _claim(request, stored=False) is ClaimStatus.CLAIMED
    kinds = _kinds(statements)
    assert kinds[0] == "ENSURE_TURN" and kinds[-1] == "FAST_CLAIM"
    # A second copy finds it running under a live lease: busy, as a claim-first message would.
    assert _claim(request, stored=False) is ClaimStatus.BUSY


def test_chatqs_own_messages_carry_the_header(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(INTERACTIVE_QUEUE)
        turn = submit_turn(create_session(framework="none", model="echo"), "hello")
        raw = client.lpop(INTERACTIVE_QUEUE)
        assert raw is not None
        headers = json.loads(raw)["headers"]
        assert headers["id"] == str(turn.turn_id) and headers.get(STORED_HEADER) is True
    finally:
        client.delete(INTERACTIVE_QUEUE)
        client.close()

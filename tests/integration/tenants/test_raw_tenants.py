"""A raw task message's `tenant` (another language's producer, no `submit_turn`): the session it
creates gets it, an existing session takes its turn only if it is that tenant's, and the turn's
usage counts for its session's tenant.

Run in this process with `execute_turn`, as the task body runs a message without chatq's header
(`stored=False`) and with it, against the real Postgres and Redis and the model stub.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from chatq.settings import get_settings, reset_settings
from models.db import session_scope
from models.tables import ChatSession, Turn
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from worker.errors import InvalidTurn
from worker.events import EventType, turn_stream
from worker.payload import GUARDED_QUEUES, INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session
from worker.queries import usage_report
from worker.runtime.delivery.runner import Outcome, Result, execute_turn
from worker.tenant_usage import spend_by_tenant

WORKER = "in-process@test"
SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"


@pytest.fixture
def runtime(chatq_env: dict[str, str], openai_stub: OpenAIStub, redis_url: str) -> Iterator[OpenAIStub]:
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)  # what the runner sent: no worker of this package runs it
    finally:
        client.close()


def _raw(session_id: uuid.UUID, content: str, **more: Any) -> TurnRequest:
    """A raw producer's message, parsed as the task body parses it."""
    kwargs = {"session_id": str(session_id), "content": content, **more}
    return parse_turn_request(kwargs, task_id=str(uuid.uuid4()), settings=get_settings())


def _run(request: TurnRequest, *, stored: bool) -> Result:
    return execute_turn(request, queue=INTERACTIVE_QUEUE, worker=WORKER, runtime=build_runtime(), stored=stored)


@pytest.mark.parametrize("stored", [False, True], ids=["raw header", "chatq header"])
def test_a_raw_message_with_a_tenant_creates_its_session_with_it(runtime: OpenAIStub, stored: bool) -> None:
    session_id = uuid.uuid4()
    first = _raw(session_id, "hello [words: 3]", tenant=ACME)
    assert _run(first, stored=stored).outcome is Outcome.SUCCEEDED
    with session_scope() as db:
        session = db.get(ChatSession, session_id)
        assert session is not None and session.tenant == ACME
    # Its next messages, with the tenant or without one, go on in it.
    assert _run(_raw(session_id, "again [words: 2]", tenant=ACME), stored=stored).outcome is Outcome.SUCCEEDED
    assert _run(_raw(session_id, "and on [words: 2]"), stored=stored).outcome is Outcome.SUCCEEDED
    # A message without a tenant creates a session of none, as before.
    plain = uuid.uuid4()
    assert _run(_raw(plain, "hello [words: 1]"), stored=stored).outcome is Outcome.SUCCEEDED
    with session_scope() as db:
        row = db.get(ChatSession, plain)
        assert row is not None and row.tenant is None


@pytest.mark.parametrize("owner", [ACME, None], ids=["another tenant", "no tenant"])
@pytest.mark.parametrize("stored", [False, True], ids=["raw header", "chatq header"])
def test_a_raw_message_naming_another_tenant_fails_and_stores_nothing(
    runtime: OpenAIStub, owner: str | None, stored: bool
) -> None:
    session_id = create_session(framework="langgraph", tenant=owner)
    request = _raw(session_id, "not yours", tenant=GLOBEX)
    result = _run(request, stored=stored)
    assert result.outcome is Outcome.FAILED
    assert result.error is not None and "\n" not in result.error
    assert f"not to tenant {GLOBEX!r}" in result.error
    with session_scope() as db:
        assert db.get(Turn, request.turn_id) is None
        session = db.get(ChatSession, session_id)
        assert session is not None and session.tenant == owner and session.next_turn_position == 0
    assert not any("not yours" in str(body) for body in runtime.requests), "the model was called"
    # The session's watchers hear why: the turn's one event is that error.
    events = [str(fields) for _, fields in build_runtime().redis.xrange(turn_stream(request.turn_id))]
    assert len(events) == 1 and EventType.ERROR.value in events[0] and GLOBEX in events[0], events


def test_a_raw_message_with_a_bad_tenant_name_is_refused_as_bad_input(runtime: OpenAIStub) -> None:
    with pytest.raises(InvalidTurn, match="is not a tenant name"):
        _raw(uuid.uuid4(), "hello", tenant="acme corp")


def test_a_raw_turns_usage_counts_for_its_sessions_tenant(runtime: OpenAIStub) -> None:
    tenant, other = f"billed-{uuid.uuid4().hex[:8]}", f"unbilled-{uuid.uuid4().hex[:8]}"
    session_id = uuid.uuid4()
    assert _run(_raw(session_id, "count me [words: 2]", tenant=tenant), stored=False).outcome is Outcome.SUCCEEDED
    report = usage_report(tenant=tenant)
    assert report["turns"] == 1 and report["total_tokens"] > 0
    assert usage_report(tenant=other)["turns"] == 0
    rows = {row.tenant: row for row in spend_by_tenant()}
    assert rows[tenant].turns == 1 and other not in rows

"""A session's tenant from the Python API: `create_session(tenant=)` stores it, `submit_turn(tenant=)`
stores a turn only into that tenant's session, and a schedule's template sessions carry a checked one.

Against the real Postgres and Redis; no worker runs here, the submitted turns stay queued.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn, TurnStatus
from worker.errors import InvalidSchedule, InvalidTurn, SessionNotFound, TenantMismatch
from worker.event_scripts import UNENDED
from worker.events import get_redis
from worker.producer import create_schedule, create_session, get_session, submit_turn

pytestmark = pytest.mark.usefixtures("chatq_env", "drop_sent_messages")  # no worker runs these turns

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"


def _stored(session_id: uuid.UUID) -> dict[str, Any]:
    """What a refused submit must not change: the session's turns, messages and next position."""
    with session_scope() as db:
        session = db.get(ChatSession, session_id)
        assert session is not None
        return {
            "turns": db.execute(select(Turn.id, Turn.status).where(Turn.session_id == session_id)).all(),
            "messages": db.execute(
                select(func.count()).select_from(ChatMessage).where(ChatMessage.session_id == session_id)
            ).scalar_one(),
            "next": session.next_turn_position,
        }


def test_create_session_stores_its_tenant_and_refuses_a_bad_name() -> None:
    session_id = create_session(framework="none", tenant=ACME)
    assert get_session(session_id)["tenant"] == ACME
    assert get_session(session_id, tenant=ACME)["id"] == str(session_id)
    with pytest.raises(SessionNotFound):
        get_session(session_id, tenant=GLOBEX)
    assert get_session(create_session(framework="none"))["tenant"] is None

    refused = uuid.uuid4()
    for bad in ("acme corp", "", "x" * 65, "acme:1", 7):
        with pytest.raises(InvalidTurn, match="tenant"):
            create_session(framework="none", session_id=refused, tenant=bad)  # type: ignore[arg-type]
    with session_scope() as db:
        assert db.get(ChatSession, refused) is None


def test_a_turn_submitted_with_its_sessions_tenant_or_none_is_stored() -> None:
    session_id = create_session(framework="none", tenant=ACME)
    named = submit_turn(session_id, "with the tenant", tenant=ACME)
    unnamed = submit_turn(session_id, "without one")
    assert (named.position, unnamed.position) == (0, 1)
    # Idempotent as ever when the tenant agrees.
    again = submit_turn(session_id, "with the tenant", tenant=ACME, turn_id=named.turn_id)
    assert (again.created, again.turn_id) == (False, named.turn_id)
    delayed = submit_turn(session_id, "later", tenant=ACME, delay=3600)
    assert delayed.run_at is not None


@pytest.mark.parametrize("owner", [ACME, None], ids=["another tenant", "no tenant"])
def test_a_turn_naming_another_tenant_is_refused_and_nothing_is_stored(owner: str | None) -> None:
    session_id = create_session(framework="none", tenant=owner)
    waiting = submit_turn(session_id, "queued before")
    before = _stored(session_id)
    turn_id = uuid.uuid4()
    attempts: list[dict[str, Any]] = [
        {},
        {"if_busy": "interrupt"},
        {"if_busy": "reject"},
        {"webhook": "https://example.com/hook"},
        {"run_at": datetime.now(UTC) + timedelta(hours=1)},
    ]
    for extra in attempts:
        with pytest.raises(TenantMismatch) as raised:
            submit_turn(session_id, "not yours", tenant=GLOBEX, turn_id=turn_id, **extra)
        message = raised.value.message
        assert "\n" not in message and f"not to tenant {GLOBEX!r}" in message, extra
        assert (f"tenant {owner!r}" if owner else "no tenant") in message
        assert _stored(session_id) == before, f"{extra} stored or changed something"
    with session_scope() as db:
        assert db.get(Turn, turn_id) is None
        waiting_row = db.get(Turn, waiting.turn_id)
        assert waiting_row is not None and waiting_row.status is TurnStatus.QUEUED, "interrupt cancelled a turn"
    # Not even noted as ending (the sweep would publish its `cancelled` event): refused before the cancel.
    assert get_redis().zscore(UNENDED, str(waiting.turn_id)) is None
    # A resubmission of a turn of that session under another tenant is refused too, not "accepted".
    with pytest.raises(TenantMismatch):
        submit_turn(session_id, "queued before", tenant=GLOBEX, turn_id=waiting.turn_id)


def test_a_bad_tenant_name_on_submit_is_bad_input() -> None:
    session_id = create_session(framework="none", tenant=ACME)
    with pytest.raises(InvalidTurn, match="is not a tenant name"):
        submit_turn(session_id, "hello", tenant="acme corp")
    assert _stored(session_id)["turns"] == []


def test_submit_does_not_create_a_session_whatever_the_tenant() -> None:
    missing = uuid.uuid4()
    with pytest.raises(SessionNotFound):
        submit_turn(missing, "hello", tenant=ACME)
    with session_scope() as db:
        assert db.get(ChatSession, missing) is None


def test_a_schedules_template_sessions_take_a_checked_tenant() -> None:
    template = {"framework": "none"}
    schedule = create_schedule(content="tick", session_template=template, every=3600, tenant=ACME)
    assert schedule.tenant == ACME
    with pytest.raises(InvalidSchedule, match="is not a tenant name"):
        create_schedule(content="tick", session_template=template, every=3600, tenant="acme corp")

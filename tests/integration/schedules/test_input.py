"""Bad input is one line and stores nothing; schedules are scoped by tenant like sessions."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import Schedule
from worker.errors import InvalidSchedule, ScheduleNotFound, SessionNotFound
from worker.producer import create_schedule, create_session, delete_schedule, get_schedule, list_schedules

TEMPLATE = {"framework": "none"}


def _count() -> int:
    with session_scope() as db:
        return int(db.execute(select(func.count()).select_from(Schedule)).scalar_one())


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"cron": "61 * * * *"}, InvalidSchedule, "bad cron expression"),
        ({"cron": "* * *"}, InvalidSchedule, "bad cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, InvalidSchedule, "unknown time zone"),
        ({"cron": "* * * * *", "every": 60}, InvalidSchedule, "exactly one of cron"),
        ({}, InvalidSchedule, "exactly one of cron"),
        ({"every": 0.5}, InvalidSchedule, "every must be"),
        ({"every": 10, "overlap": "sometimes"}, InvalidSchedule, "unknown overlap"),
        ({"every": 10, "misfire": "never"}, InvalidSchedule, "unknown misfire"),
        ({"every": 10, "max_runs": 0}, InvalidSchedule, "max_runs"),
        ({"every": 10, "session_template": {"framework": "nope"}}, InvalidSchedule, "unknown agent framework"),
        ({"every": 10, "session_template": {"colour": "red"}}, InvalidSchedule, "unknown session_template"),
        ({"every": 10, "session_template": None, "session_id": uuid.uuid4()}, SessionNotFound, "does not exist"),
        ({"every": 10, "session_template": None}, InvalidSchedule, "exactly one of session_id"),
    ],
)
def test_bad_input_is_one_line_and_stores_nothing(arguments: dict[str, Any], error: type, says: str) -> None:
    before = _count()
    with pytest.raises(error) as raised:
        create_schedule(content="x", **{"session_template": TEMPLATE, **arguments})
    assert says in str(raised.value) and "\n" not in str(raised.value)
    assert _count() == before


def test_a_tenant_sees_only_its_own_schedules() -> None:
    acme_session = create_session(framework="none", tenant="acme")
    mine = create_schedule(session_id=acme_session, content="x", every=60, tenant="acme")
    assert mine.tenant == "acme"
    theirs = create_schedule(session_template=TEMPLATE, content="y", every=60, tenant="globex")
    with pytest.raises(SessionNotFound):  # another tenant's session cannot carry a schedule
        create_schedule(session_id=acme_session, content="x", every=60, tenant="globex")
    assert [s.id for s in list_schedules(tenant="acme")] == [mine.id]
    with pytest.raises(ScheduleNotFound):
        get_schedule(theirs.id, tenant="acme")
    with pytest.raises(ScheduleNotFound):
        delete_schedule(theirs.id, tenant="acme")
    assert get_schedule(theirs.id).id == theirs.id, "the admin sees every tenant's"

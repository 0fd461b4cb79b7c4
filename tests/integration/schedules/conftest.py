"""Schedules (issue 30, part 2) against the real Postgres and Redis, fired in this process with an
injected clock (`worker.runtime.recovery.schedule_firing.fire_due_schedules`); no worker runs the turns."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
import redis
from sqlalchemy import delete

from models.db import get_engine, session_scope
from models.tables import Schedule
from worker.events import get_redis
from worker.payload import GUARDED_QUEUES
from worker.runtime.recovery.schedule_firing import fire_due_schedules

GRACE = 5.0
"""The misfire grace these tests fire with (CHATQ_SCHEDULE_MISFIRE_GRACE)."""


def fire(now: datetime, *, grace: float = GRACE) -> int:
    """One firing pass at `now`; the turns it created."""
    return fire_due_schedules(engine=get_engine(), client=get_redis(), grace=grace, retention=60, now=now)


@pytest.fixture(autouse=True)
def _clean(chatq_env: dict[str, str], redis_url: str) -> Iterator[None]:
    """No schedule of one test is due in another's clock; no task message sent here stays queued."""
    yield
    with session_scope() as db:
        db.execute(delete(Schedule))
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()

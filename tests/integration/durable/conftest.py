"""Durable steps (issue 28): turns resumed from their journal, run in this process against the real
Postgres and Redis and the model stub over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.effects import effect_tools
from worker.payload import GUARDED_QUEUES


@pytest.fixture(autouse=True)
def _effects() -> Iterator[None]:
    """The side-effect tools (`tests.support.effects`) are registered for each test."""
    with effect_tools():
        yield


@pytest.fixture(autouse=True)
def _drop_sent_messages(redis_url: str) -> Iterator[None]:
    """Remove task messages these tests sent without a worker to consume them (a later package's
    workers would run them against their own model stub)."""
    yield
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()

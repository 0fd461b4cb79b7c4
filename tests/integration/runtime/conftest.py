"""The in-process runtime tests run deliveries without a worker; what they send is not for later tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from worker.payload import GUARDED_QUEUES


@pytest.fixture(autouse=True)
def _drop_sent_messages(redis_url: str) -> Iterator[None]:
    """Remove the task messages these tests' producers and runner sent (a next turn, a retry, a
    webhook delivery): no worker consumes them here, and a later package's workers would run them
    against its own model stub."""
    yield
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()

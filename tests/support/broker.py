"""Conditions on Redis that tests wait for instead of sleeping."""

from __future__ import annotations

import time

import redis

QUEUES = ("chatq", "chatq.batch")
UNACKED = "unacked"
"""kombu's Redis transport keeps messages taken but not yet acknowledged in this hash."""
UNACKED_INDEX = "unacked_index"
"""...and when each was taken, in this sorted set (score: the time it was taken)."""


class _TestClock:
    """When the running test started (set by tests/conftest.py for every test)."""

    started = 0.0


test_clock = _TestClock()


def wait_until(condition_name: str, check: object, *, timeout: float = 30.0) -> None:
    """Poll `check()` until it is true; fail naming the condition after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting until {condition_name}")
        time.sleep(0.02)


def wait_for_drained_queues(redis_url: str, *, timeout: float = 30.0) -> None:
    """Wait until no message is queued or held unacknowledged by a worker (every copy processed).

    Only messages taken since the test started count: a fault test's killed worker leaves its
    messages unacknowledged until the visibility timeout (an hour), in the same Redis db.
    """
    client = redis.Redis.from_url(redis_url)

    def drained() -> bool:
        recently_taken = client.zcount(UNACKED_INDEX, test_clock.started, "+inf")
        return sum(client.llen(q) for q in QUEUES) == 0 and recently_taken == 0

    try:
        wait_until("the queues are empty and every taken message acknowledged", drained, timeout=timeout)
    finally:
        client.close()


def wait_for_subscriber(redis_url: str, channel: str, *, timeout: float = 30.0) -> None:
    """Wait until someone subscribes to a pub/sub channel."""
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(
            f"{channel} has a subscriber",
            lambda: dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) > 0,
            timeout=timeout,
        )
    finally:
        client.close()

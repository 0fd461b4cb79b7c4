"""Conditions on Redis that tests wait for instead of sleeping."""

from __future__ import annotations

import time

import redis

QUEUES = ("chatq", "chatq.batch")
UNACKED = "unacked"
"""kombu's Redis transport keeps messages taken but not yet acknowledged in this hash."""


def wait_until(condition_name: str, check: object, *, timeout: float = 30.0) -> None:
    """Poll `check()` until it is true; fail naming the condition after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting until {condition_name}")
        time.sleep(0.02)


def wait_for_drained_queues(redis_url: str, *, timeout: float = 30.0) -> None:
    """Wait until no message is queued or held unacknowledged by a worker (every copy processed)."""
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(
            "the queues are empty and every taken message acknowledged",
            lambda: sum(client.llen(q) for q in QUEUES) == 0 and client.hlen(UNACKED) == 0,
            timeout=timeout,
        )
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

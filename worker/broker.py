"""The Redis broker transport chatq's Celery app uses: kombu's, with one client per channel.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside its consumer
loop (`Channel.conn_or_acquire` without a client): each task message and each task event (sent,
received, started, succeeded) gets its own. redis-py 8 spends about 0.2 ms of CPU building one
(it copies some 170 response callbacks into a case-insensitive dict), more than the publish's
round trip. A `redis.Redis` is thread-safe over its connection pool, so one per channel serves
every publish; it is dropped with the pools when kombu drops them (a fork, a closed channel).

Selected with `broker_transport` in `celeryconfig.py`; URLs, options and TLS work as with kombu's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, reusing one client for commands that bring none."""

    _shared_client: redis.Redis | None = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None:
            # A race here builds two clients over the same pool; harmless, the last one is kept.
            shared = self._shared_client = self._create_client()  # type: ignore[attr-defined]
        yield shared

    def _disconnect_pools(self) -> None:
        self._shared_client = None
        super()._disconnect_pools()  # type: ignore[misc]


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel

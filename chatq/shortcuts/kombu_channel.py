"""kombu's Redis channel with one redis-py client per channel, for commands that bring none.

Written against kombu 5.5 to 5.7 (tested on 5.7.0) with redis-py 8. kombu's channel builds a new
`redis.Redis` for every command it sends outside its consumer loop (`Channel.conn_or_acquire`
without a client): each task message and each task event. Building one with redis-py 8 copies its
response callbacks, which costs more CPU than the publish's round trip (BENCHMARKS.md, "Shortcuts
through other libraries"). A `redis.Redis` is thread-safe over its connection pool, so one per
channel serves every publish; it is dropped with the pools when kombu drops them (a fork, a
closed channel).

Bypasses: kombu's `Channel.conn_or_acquire`, and uses its private `_create_client` and
`_disconnect_pools`. Fallback: on another kombu minor version, or when one of those is missing,
`conn_or_acquire` is kombu's own (a client per command), logged once at INFO.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from chatq.shortcuts import Gate, minor_version

_VERSION = metadata.version("kombu")

__all__ = ["ENABLED", "GATE", "ClientReusingChannel"]

WRITTEN_FOR = ((5, 5), (5, 7))
"""The kombu minor versions (inclusive) this shortcut was written against."""
HOOKS = ("conn_or_acquire", "_create_client", "_disconnect_pools")

ENABLED = True
"""False selects kombu's own `conn_or_acquire` (benchmarks and tests compare the two)."""


def _problem() -> str | None:
    version = minor_version(_VERSION)
    if not WRITTEN_FOR[0] <= version <= WRITTEN_FOR[1]:
        return f"kombu {_VERSION} is not one of {WRITTEN_FOR}"
    missing = [name for name in HOOKS if not hasattr(kombu_redis.Channel, name)]
    return f"kombu's Redis channel has no {', '.join(missing)}" if missing else None


GATE = Gate("kombu_channel", _problem)


class ClientReusingChannel(kombu_redis.Channel):
    """kombu's Redis channel, reusing one client for commands that bring none."""

    _shared_client: redis.Redis | None = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client or not (ENABLED and GATE.usable()):
            with super().conn_or_acquire(client) as acquired:
                yield acquired
            return
        shared = self._shared_client
        if shared is None:
            # A race here builds two clients over the same pool; harmless, the last one is kept.
            shared = self._shared_client = self._create_client()  # type: ignore[attr-defined]
        yield shared

    def _disconnect_pools(self) -> None:
        self._shared_client = None
        parent = getattr(super(), "_disconnect_pools", None)
        if parent is not None:
            parent()

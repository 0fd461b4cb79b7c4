"""kombu's routing tables in Redis, kept to one binding per chatq queue.

Up to this release both queues were bound to the exchange `chatq` with routing key `chatq`, so a
message published to that exchange (a retry of a message whose producer named it) reached both.
The queues now have exchanges of their own, but Redis keeps the old binding until someone removes
it: `drop_stray_bindings` does, at worker start and in every sweep.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu import Queue

__all__ = ["declare_queues", "drop_stray_bindings"]

log = logging.getLogger(__name__)

_SEP = "\x06\x16"
"""kombu's field separator in a binding (`routing_key`, `pattern`, `queue`)."""
_TABLES = ("_kombu.binding.%s", "_kombu.binding_permanent.%s")
"""kombu's Redis keys holding an exchange's bindings (5.x)."""


def declare_queues(app: Any, client: Any) -> None:
    """Declare chatq's queues (cheap and idempotent), then drop stray bindings.

    A Redis that lost its data (FLUSHDB, a restart without persistence) also lost kombu's queue
    bindings, and producers that declared them before will not again: their messages would go
    nowhere until someone declares the queues. Workers do at start and in each sweep. `client` is
    the Redis client the bindings are read with (the runtime's).
    """
    queues = tuple(app.conf.task_queues)
    with app.connection_for_write() as connection:
        for queue in queues:
            queue(connection.default_channel).declare()
    drop_stray_bindings(client, queues)


def drop_stray_bindings(client: Any, queues: tuple[Queue, ...]) -> int:
    """Remove bindings of chatq's exchanges that lead to a queue other than the one declared for
    them; the number removed."""
    removed = 0
    for queue in queues:
        if queue.exchange is None or not queue.exchange.name:
            continue
        for table in _TABLES:
            key = table % queue.exchange.name
            members = client.smembers(key)
            stray = [m for m in members if _queue_of(m) != queue.name]
            if stray:
                removed += int(client.srem(key, *stray))
    if removed:
        log.warning("removed %d stray queue binding(s) left by an earlier chatq", removed)
    return removed


def _queue_of(member: bytes | str) -> str:
    text = member.decode() if isinstance(member, bytes) else member
    return text.rsplit(_SEP, 1)[-1]

"""Redis commands for the per-event hot path, packed once and sent on one of the client's pooled
connections, without building a redis-py pipeline.

A stream event is three commands (PUBLISH, XADD, EXPIRE). Through `client.pipeline()` they cost
about 120 us of CPU per event, most of it the pipeline object, per-command packing and response
callbacks; packed here and sent on a pooled connection they cost about 65 us. A turn sends one
event per text chunk, so this is the hottest Redis path chatq has.

The connection comes from the client's own pool, so its health checks, reconnects and fork safety
still apply, and its retry policy (`worker.events.make_redis`) is used the way redis-py's pipeline
uses it: a connection or timeout error disconnects and tries again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["pack", "roundtrip"]

Arg = str | bytes | int


def _bulk(arg: Arg) -> bytes:
    data = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(*args: Arg) -> bytes:
    """One command in RESP: an array of bulk strings (str is UTF-8 encoded, int in decimal)."""
    return b"*%d\r\n%b" % (len(args), b"".join(_bulk(arg) for arg in args))


def roundtrip(client: redis.Redis, commands: Sequence[bytes]) -> list[Any]:
    """Send packed commands in one write on a pooled connection and return their replies.

    Raises redis-py's errors: ResponseError for a command Redis refused (the connection is then
    dropped, since later replies were not read), ConnectionError/TimeoutError once the client's
    retries are spent.
    """
    pool = client.connection_pool
    connection: Any = pool.get_connection()
    try:
        return list(
            connection.retry.call_with_retry(
                lambda: _send_and_read(connection, commands),
                lambda _error: connection.disconnect(),
            )
        )
    finally:
        pool.release(connection)


def _send_and_read(connection: Any, commands: Sequence[bytes]) -> list[Any]:
    connection.send_packed_command([b"".join(commands)])
    try:
        return [connection.read_response() for _ in commands]
    except redis.ResponseError:
        connection.disconnect()  # replies after the refused one are still unread
        raise

"""Redis commands for the per-event hot path, packed once and sent on a pooled redis-py connection.

Written against redis-py 8 (tested on 8.1.0). A stream event is three commands (PUBLISH, XADD,
EXPIRE); through `client.pipeline()` most of their CPU is the pipeline object, per-command packing
and response callbacks. Packed here and sent on one of the client's pooled connections they cost
about half (BENCHMARKS.md, "Shortcuts through other libraries"). A turn sends one event per text
chunk, so this is the hottest Redis path chatq has.

Bypasses: redis-py's pipeline, using its connection-level methods (`ConnectionPool.get_connection`
without arguments, `Connection.send_packed_command`, `read_response`, `retry`). The connection
comes from the client's own pool, so its health checks, reconnects and fork safety still apply,
and its retry policy is used the way redis-py's pipeline uses it: a connection or timeout error
disconnects and tries again. Fallback: on another redis-py major version, or when one of those is
missing, the commands go through `client.pipeline(transaction=False)`, logged once at INFO.

Between round trips a few connections stay with this module (`KEEP_IDLE` per pool and process)
instead of going back to the pool: `ConnectionPool.get_connection` and `release` cost about a third
of a round trip's CPU (a lock, a readiness poll, four metric updates and an event each). Such a
connection is only ever left with every reply read (a refused command disconnects it); one the
server closed meanwhile fails its send or read, which the retry disconnects and sends again, as
above. A fork leaves the parent's behind (they are the pool's to drop).
Errors are the same either way (ResponseError for a refused command, ConnectionError/TimeoutError
once the client's retries are spent); replies too, except that the pipeline applies redis-py's
response callbacks (SET's b"OK" becomes True), so callers read replies of commands without one
(EVAL, EVALSHA, PUBLISH, XADD).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import redis
from redis.connection import Connection, ConnectionPool

from chatq.shortcuts import Gate, minor_version

_VERSION = metadata.version("redis")

__all__ = ["ENABLED", "GATE", "Arg", "pack", "roundtrip"]

WRITTEN_FOR = 8
"""The redis-py major version this shortcut was written against."""

ENABLED = True
"""False selects redis-py's pipeline (benchmarks and tests compare the two)."""

Arg = str | bytes | int

KEEP_IDLE = 8
"""Connections kept between round trips, per pool and process (more in flight go back to the pool)."""

_idle: weakref.WeakKeyDictionary[ConnectionPool, tuple[int, list[Any]]] = weakref.WeakKeyDictionary()
_idle_lock = threading.Lock()

_CONNECTION_HOOKS = ("send_packed_command", "read_response", "disconnect", "should_reconnect")


def _problem() -> str | None:
    if minor_version(_VERSION)[0] != WRITTEN_FOR:
        return f"redis-py {_VERSION} is not {WRITTEN_FOR}.x"
    missing = [
        f"{owner.__name__}.{name}"
        for owner, names in ((ConnectionPool, ("get_connection", "release")), (Connection, _CONNECTION_HOOKS))
        for name in names
        if not hasattr(owner, name)
    ]
    return f"redis-py has no {', '.join(missing)}" if missing else None


GATE = Gate("redis_resp", _problem)


def _bulk(arg: Arg) -> bytes:
    data = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(*args: Arg) -> bytes:
    """One command in RESP: an array of bulk strings (str is UTF-8 encoded, int in decimal)."""
    return b"*%d\r\n%b" % (len(args), b"".join(_bulk(arg) for arg in args))


def roundtrip(client: redis.Redis, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """Send commands (each a sequence of arguments) in one write and return their raw replies.

    Raises redis-py's errors: ResponseError for a command Redis refused, ConnectionError/
    TimeoutError once the client's retries are spent.
    """
    if not (ENABLED and GATE.usable()):
        return _pipelined(client, commands)
    packed = [pack(*command) for command in commands]
    pool = client.connection_pool
    kept = _kept(pool)
    try:
        connection: Any = kept.pop()
    except IndexError:
        connection = pool.get_connection()
    try:
        replies = list(
            connection.retry.call_with_retry(
                lambda: _send_and_read(connection, packed),
                lambda _error: connection.disconnect(),
            )
        )
    except BaseException:
        pool.release(connection)
        raise
    if len(kept) < KEEP_IDLE and not connection.should_reconnect():
        kept.append(connection)  # every reply read: ready for the next round trip
    else:
        pool.release(connection)
    return replies


def _kept(pool: ConnectionPool) -> list[Any]:
    """This process's idle connections of `pool` (list.pop and list.append are atomic)."""
    entry = _idle.get(pool)
    pid = os.getpid()
    if entry is None or entry[0] != pid:
        with _idle_lock:
            entry = _idle.get(pool)
            if entry is None or entry[0] != pid:
                entry = _idle[pool] = (pid, [])
    return entry[1]


def _send_and_read(connection: Any, commands: Sequence[bytes]) -> list[Any]:
    connection.send_packed_command([b"".join(commands)])
    try:
        return [connection.read_response() for _ in commands]
    except redis.ResponseError:
        connection.disconnect()  # replies after the refused one are still unread
        raise


def _pipelined(client: redis.Redis, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """The public API's way: a non-transactional pipeline (its response callbacks apply)."""
    with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return list(pipe.execute())

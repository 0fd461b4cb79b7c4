"""The engine and session factory, built lazily once per process.

Nothing connects at import time. Both engines are `chatq.per_process` values: after a fork (Celery
prefork, a test that spawns) the child builds its own instead of sharing the parent's sockets, as
SQLAlchemy's pooling guide asks.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from chatq.masking import mask_secrets
from chatq.per_process import PerProcess
from chatq.settings import get_settings

POOL_SIZE = 10
"""Connections a process keeps open."""
POOL_OVERFLOW = 10
"""More it may open at a burst (closed when returned): at most POOL_SIZE + POOL_OVERFLOW in all."""

PING_AFTER_IDLE = 0.5
"""Seconds a pooled connection may sit unused before it is pinged at checkout (HikariCP's
`aliveBypassWindowMs` is the same 500 ms)."""


def _mark_idle(dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _input_pending(dbapi_connection: Any) -> bool:
    """Whether an idle connection's socket has something to read: a server that restarted or
    closed it (its FATAL message, then EOF). An idle, healthy one has nothing."""
    try:
        poller = select.poll()
        poller.register(dbapi_connection.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # a closed connection has no fileno
        return True


def _make_checkout_check(engine: Engine) -> Any:
    def check(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        """Pessimistic disconnect handling, without a round trip per checkout.

        `pool_pre_ping` pings on every checkout: four or five round trips per turn. A connection
        checked in moments ago is only pinged when its socket says the server hung up; one idle
        longer than PING_AFTER_IDLE is always pinged. A failed check hands the pool a fresh one.
        """
        idle = time.monotonic() - record.info.get("idle_since", time.monotonic())
        if idle < PING_AFTER_IDLE and not _input_pending(dbapi_connection):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"pooled connection is dead: {mask_secrets(str(exc))}") from exc

    return check


def _build_pooled() -> tuple[Engine, sessionmaker[Session]]:
    settings = get_settings()
    engine = create_engine(
        settings.database_url,
        # Postgres restarts must not fail turns: pooled connections are tested before use
        # (the checkout listener below, a cheaper pool_pre_ping).
        # Fixed, whatever the worker's concurrency: a turn holds a connection only for its
        # short claim/persist transactions, never while it waits on the model, so a few
        # connections serve hundreds of turns (README, "Workers": connections per worker).
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=30,
        pool_recycle=1800,
        # Errors can travel to logs and Flower; they must never carry users' messages.
        hide_parameters=True,
        connect_args={"connect_timeout": 5, "application_name": "chatq"},
    )
    event.listen(engine.pool, "checkin", _mark_idle)
    event.listen(engine.pool, "checkout", _make_checkout_check(engine))
    return engine, sessionmaker(engine, expire_on_commit=False)


_pooled: PerProcess[tuple[Engine, sessionmaker[Session]]] = PerProcess(
    _build_pooled,
    close=lambda pooled: pooled[0].dispose(),
    # Inherited from the parent: drop its pooled connections without closing them under it.
    inherited=lambda pooled: pooled[0].dispose(close=False),
)


def get_engine() -> Engine:
    """The process's engine for `DATABASE_URL`, created on first use."""
    return _pooled.get()[0]


def get_sessionmaker() -> sessionmaker[Session]:
    """The session factory bound to this process's engine."""
    return _pooled.get()[1]


# The scopes take the engine to use: the worker's runtime hands its own down (`Runtime.engine`);
# None is the process's engine, for the public no-argument paths (models' functions, the CLI).


@contextmanager
def session_scope(engine: Engine | None = None) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any error."""
    if engine is None:
        with get_sessionmaker().begin() as session:
            yield session
        return
    with Session(engine, expire_on_commit=False) as session, session.begin():
        yield session


@contextmanager
def connection_scope(engine: Engine | None = None) -> Iterator[Connection]:
    """A Core connection in one transaction, for hot paths that need no ORM objects."""
    with (engine or get_engine()).begin() as connection:
        yield connection


@contextmanager
def autocommit_scope(engine: Engine | None = None) -> Iterator[Connection]:
    """A Core connection in autocommit mode, for writes that are one statement (often a CTE).

    A single statement is atomic on its own; outside a transaction it costs one round trip
    instead of three (BEGIN, the statement, COMMIT). Never use it for two writes that must
    succeed or fail together.
    """
    with (engine or get_engine()).connect() as connection:
        yield connection.execution_options(isolation_level="AUTOCOMMIT")


_unpooled: PerProcess[Engine] = PerProcess(
    lambda: create_engine(
        get_settings().database_url,
        poolclass=NullPool,
        hide_parameters=True,
        connect_args={"connect_timeout": 5, "application_name": "chatq"},
    ),
    close=lambda engine: engine.dispose(),
)


@contextmanager
def unpooled_connection() -> Iterator[Connection]:
    """A Core connection of its own, in autocommit mode, closed (not pooled) when the block ends.

    For session-level state such as advisory locks: the Postgres session ends with the block (or
    with the process, however it dies), and every session-level lock it took goes with it. A pooled
    connection would carry such a lock on to whoever checks it out next.
    """
    with _unpooled.get().connect() as connection:
        yield connection.execution_options(isolation_level="AUTOCOMMIT")


def dispose_engine() -> None:
    """Close the pool (tests that switch databases, and shutdown)."""
    _pooled.reset()
    _unpooled.reset()

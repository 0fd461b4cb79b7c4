"""Whether the database has chatq's tables: a database nobody migrated gets one clear hint.

Without it a user sees Postgres's own `relation "chat_sessions" does not exist`. The CLI, `chatq
worker` and `chatq serve` recognise that error here and say to run `chatq db upgrade` instead, and
the Python producer API (`worker.producer`, each call `explains_missing_schema`) raises the same
one-line `SchemaMissing` in place of SQLAlchemy's ProgrammingError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from worker.errors import SchemaMissing

if TYPE_CHECKING:
    from chatq.settings import Settings

UNDEFINED_TABLE = "42P01"
"""Postgres's SQLSTATE for a missing table (psycopg's `errors.UndefinedTable`)."""

P = ParamSpec("P")
R = TypeVar("R")

CONNECT_TIMEOUT = 3
"""Seconds the start-up check waits for Postgres before leaving the question to later."""


def is_undefined_table(exc: BaseException) -> bool:
    """True when `exc` (a SQLAlchemy error or the psycopg error it wraps, or what caused it) is a missing table."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlstate", None) == UNDEFINED_TABLE:
            return True
        orig = getattr(current, "orig", None)
        if isinstance(orig, BaseException) and getattr(orig, "sqlstate", None) == UNDEFINED_TABLE:
            return True
        current = current.__cause__ or current.__context__
    return False


def schema_missing(database_url_masked: str) -> SchemaMissing:
    """The error to show for the database at `database_url_masked` without chatq's tables."""
    return SchemaMissing(f"the database at {database_url_masked} has no chatq tables yet: run `chatq db upgrade`")


def require_schema(settings: Settings) -> None:
    """Raise SchemaMissing if Postgres answers and has no chatq tables.

    A Postgres that does not answer (or any other error) is not this check's business: workers
    and the gateway start anyway and reconnect once it is back, as they always have.
    """
    engine = create_engine(settings.database_url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM chat_sessions LIMIT 0"))
    except DBAPIError as exc:
        # Anything else (Postgres down, a permission problem) shows where it happens, as before.
        if is_undefined_table(exc):
            raise schema_missing(settings.database_url_masked) from None
    finally:
        engine.dispose()


def explains_missing_schema(function: Callable[P, R], *, where: Callable[[], str]) -> Callable[P, R]:
    """`function`, raising SchemaMissing (one line: run `chatq db upgrade`) where it would raise the
    database's missing-table error; every other error passes unchanged. `where` names the database
    (its masked URL), asked only when the error happens."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            if is_undefined_table(exc):
                # `from None`: the user reads one line, not SQLAlchemy's traceback (still in __context__).
                raise schema_missing(where()) from None
            raise

    return call

"""Per-test-run isolation on the real Postgres and Redis: a fresh database and a private Redis db."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import redis
from sqlalchemy.engine import make_url

BASE_DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@localhost:5432/chatq")
BASE_REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")


def _admin(url: str) -> psycopg.Connection:
    u = make_url(url)
    return psycopg.connect(
        host=u.host or "localhost",
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password,
        dbname="postgres",
        autocommit=True,
    )


@contextmanager
def fresh_database(prefix: str = "chatq_test", *, migrate: bool = True) -> Iterator[str]:
    """Create a throw-away database (migrated to head), yield its URL, drop it afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    with _admin(BASE_DATABASE_URL) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(BASE_DATABASE_URL).set(database=name).render_as_string(hide_password=False)
    try:
        if migrate:
            from models.migrate import upgrade

            upgrade(url)
        yield url
    finally:
        with _admin(BASE_DATABASE_URL) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def private_redis_db() -> Iterator[str]:
    """Reserve a Redis logical database (1..15) for this test run, flush it before and after."""
    control = redis.Redis.from_url(BASE_REDIS_URL)
    token = secrets.token_hex(8)
    for db in range(15, 0, -1):
        if control.set(f"chatq:test-db-lock:{db}", token, nx=True, ex=3600):
            break
    else:
        raise RuntimeError("no free Redis logical database for this test run")
    url = _with_db(BASE_REDIS_URL, db)
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
        if control.get(f"chatq:test-db-lock:{db}") == token.encode():
            control.delete(f"chatq:test-db-lock:{db}")
        control.close()


def _with_db(url: str, db: int) -> str:
    head, _, tail = url.partition("://")
    rest = tail.split("?", 1)
    hostpart = rest[0].split("/", 1)[0]
    query = f"?{rest[1]}" if len(rest) > 1 else ""
    return f"{head}://{hostpart}/{db}{query}"

"""Scanning everything chatq stores for an id: every table's rows and every Redis key and value.

A deleted session must leave nothing behind: no row that names it or one of its turns, and no Redis
key or value that does (task messages included, whose kombu bodies are base64 inside JSON).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from sqlalchemy import text

from models.db import session_scope


def tables_mentioning(needles: Iterable[str]) -> dict[str, int]:
    """Tables of the database with rows whose text form contains any needle, with how many rows."""
    found: dict[str, int] = {}
    patterns = [f"%{needle}%" for needle in needles]
    with session_scope() as db:
        tables = db.execute(
            text(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ).scalars()
        for table in list(tables):
            count = db.execute(
                text(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE ANY(:patterns)'),
                {"patterns": patterns},
            ).scalar_one()
            if count:
                found[table] = int(count)
    return found


def _texts(value: bytes) -> Iterator[str]:
    """A Redis value as text, and any base64 body inside it (kombu's message envelope)."""
    decoded = value.decode("utf-8", "replace")
    yield decoded
    try:
        envelope: Any = json.loads(decoded)
    except ValueError:
        return
    body = envelope.get("body") if isinstance(envelope, dict) else None
    if isinstance(body, str):
        try:
            yield base64.b64decode(body).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return


def _values(client: redis.Redis, key: bytes) -> Iterator[bytes]:
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "string":
        value: Any = client.get(key)
        if value is not None:
            yield value
    elif kind == "list":
        yield from client.lrange(key, 0, -1)  # type: ignore[misc]
    elif kind == "hash":
        for field, value in client.hgetall(key).items():  # type: ignore[union-attr]
            yield field
            yield value
    elif kind == "set":
        yield from client.smembers(key)  # type: ignore[union-attr]
    elif kind == "zset":
        yield from client.zrange(key, 0, -1)  # type: ignore[misc]
    elif kind == "stream":
        for _entry_id, fields in client.xrange(key):  # type: ignore[union-attr]
            yield from fields.values()


def redis_mentioning(redis_url: str, needles: Iterable[str]) -> list[str]:
    """Keys of the Redis db whose name or value (decoded kombu bodies included) contains any needle."""
    wanted = list(needles)
    client = redis.Redis.from_url(redis_url)
    try:
        found = []
        for key in client.scan_iter(count=1000):
            name = key.decode("utf-8", "replace")
            if any(needle in name for needle in wanted):
                found.append(name)
                continue
            if any(needle in part for value in _values(client, key) for part in _texts(value) for needle in wanted):
                found.append(name)
        return found
    finally:
        client.close()

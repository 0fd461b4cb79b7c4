"""What Postgres can store, and what its refusals mean.

Postgres text and JSONB cannot hold U+0000, psycopg cannot encode a lone surrogate (U+D800 to
U+DFFF without its pair) as UTF-8, JSONB has no NaN or infinity, and a bigint holds at most
2**63 - 1. What producers send is checked against this at every edge (`worker.payload`) and
refused with one line naming the field; what a model returns is cleaned instead (`clean_text`,
`clean_json`, from `chatq.text`), since failing a paid reply over an invisible character helps nobody.

A write that fails anyway is told apart here: `is_outage` (Postgres or Redis unreachable or
restarting: try again later) from anything else Postgres refused (`is_refusal`: the data itself,
which no retry will change, so the turn fails at once with `refusal_message`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from chatq.masking import mask_secrets
from chatq.text import REPLACEMENT, UNSTORABLE, clean_json, clean_text

__all__ = [
    "BIGINT_MAX",
    "INTEGER_MAX",
    "MAX_JSON_DEPTH",
    "OUTAGE_ERRORS",
    "REPLACEMENT",
    "clean_json",
    "clean_text",
    "is_outage",
    "is_refusal",
    "json_problem",
    "refusal_message",
    "unstorable_char",
]

BIGINT_MAX = 2**63 - 1
"""The largest value of a Postgres bigint (`reply_to`, message ids)."""

INTEGER_MAX = 2**31 - 1
"""The largest value of a Postgres integer (token counts)."""

MAX_JSON_DEPTH = 32
"""Deepest nesting accepted in JSON a producer stores (session metadata)."""

OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    DisconnectionError,
    PoolTimeoutError,
    RedisError,
    KombuOperationalError,
    ConnectionError,
)
"""Errors of a service that is down, restarting or failing over: the turn is not at fault.

Every Redis error counts: chatq stores nothing in Redis that its content could make Redis refuse."""

_LIMIT_EXCEEDED = "54"
"""SQLSTATE class "program limit exceeded": psycopg raises it as OperationalError, but it is the
data's size or shape (an index row too large, a statement too complex), not an outage."""


def unstorable_char(text: str) -> str | None:
    """Why Postgres cannot store `text` ("a NUL character (U+0000) at position 3"), or None."""
    if text.isascii() and "\x00" not in text:
        return None
    match = UNSTORABLE.search(text)
    if match is None:
        return None
    char = match.group()
    kind = "a NUL character" if char == "\x00" else "a lone surrogate"
    return f"{kind} (U+{ord(char):04X}) at position {match.start()}"


def json_problem(value: object, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """What keeps `value` out of a JSONB column (with where, as in "[2].name"), or None."""
    stack: list[tuple[object, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            return f"is nested deeper than {max_depth} levels (at {path or 'the top'})"
        if isinstance(item, str):
            problem = unstorable_char(item)
            if problem:
                return f"has {problem} in the value at {path or 'the top'}"
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"has {item} at {path or 'the top'}, which JSON cannot hold"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"has a key of type {type(key).__name__} at {path or 'the top'}; keys must be strings"
                problem = unstorable_char(key)
                if problem:
                    return f"has {problem} in a key at {path or 'the top'}"
                stack.append((child, f"{path}.{key[:40]}" if path else key[:40], depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))
        else:
            return f"has a {type(item).__name__} at {path or 'the top'}, which is not a JSON value"
    return None


def is_outage(exc: BaseException) -> bool:
    """True for a service that is unreachable or restarting (retry later); False for refused data."""
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        if isinstance(exc, OperationalError | InterfaceError):
            return not sqlstate.startswith(_LIMIT_EXCEEDED)
        # A statement that found its connection closed under it is an outage whatever its class.
        return bool(exc.connection_invalidated)
    return isinstance(exc, OUTAGE_ERRORS)


def is_refusal(exc: BaseException) -> bool:
    """True for data Postgres (or psycopg, encoding it) refused: the same write can never succeed."""
    if isinstance(exc, UnicodeError):
        return True
    return isinstance(exc, StatementError) and not is_outage(exc)


def refusal_message(exc: BaseException, what: str) -> str:
    """One user-visible line for a refused write of `what` ("the reply")."""
    if isinstance(exc, UnicodeError):
        detail = "it is not valid Unicode text"
    else:
        original = getattr(exc, "orig", None) or exc
        first = (str(original).strip().splitlines() or [type(original).__name__])[0]
        detail = f"{type(original).__name__}: {first[:200]}"
    return mask_secrets(f"Postgres could not store {what} ({detail})")

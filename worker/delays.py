"""When a delayed turn is due: `submit_turn`'s `run_at` / `delay` checked into one time, and the
command line's and the gateway's spellings of them (`--at ISO8601`, `--in 90s`, JSON `run_at`/`delay`).

On the session side: a producer checks here and stores through `worker.store.delayed`; the
workers release due turns (`worker.runtime.recovery.due_turns`).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from worker.errors import InvalidTurn

__all__ = ["MAX_DELAY", "due_time", "parse_at", "parse_in"]

MAX_DELAY = timedelta(days=366)
"""How far ahead a turn may be delayed."""

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_IN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)


def due_time(run_at: Any = None, delay: Any = None, *, now: datetime | None = None) -> datetime | None:
    """The time a turn is to run from, or None for now (no delay, a delay of 0 or a time not ahead).

    `run_at` must be a timezone-aware datetime, `delay` a number of seconds (>= 0); at most one of
    them, and at most MAX_DELAY ahead. InvalidTurn (one line) otherwise.
    """
    if run_at is not None and delay is not None:
        raise InvalidTurn("give run_at or delay, not both")
    now = now or datetime.now(UTC)
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
            raise InvalidTurn(f"delay must be a number of seconds >= 0, not {delay!r}"[:200])
        if delay > MAX_DELAY.total_seconds():
            raise InvalidTurn(f"delay {delay:g}s is more than {MAX_DELAY.days} days")
        return now + timedelta(seconds=delay) if delay > 0 else None
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidTurn(f"run_at must be a datetime, not {type(run_at).__name__}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidTurn(f"run_at {run_at.isoformat()} has no timezone; give one (e.g. +00:00)")
    if run_at - now > MAX_DELAY:
        raise InvalidTurn(f"run_at {run_at.isoformat()} is more than {MAX_DELAY.days} days ahead")
    return run_at if run_at > now else None


def parse_at(text: str) -> datetime:
    """An ISO 8601 time with its offset (`2026-12-03T09:00:00+01:00`, `...Z`); InvalidTurn otherwise."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidTurn(f"run_at {text[:60]!r} is not an ISO 8601 time (e.g. 2026-12-03T09:00:00+00:00)") from None
    if value.tzinfo is None:
        raise InvalidTurn(f"run_at {text[:60]!r} has no timezone offset; add one (e.g. +00:00 or Z)")
    return value


def parse_in(text: str) -> float:
    """A delay as `90`, `90s`, `5m`, `2h` or `1d` (a number, optionally with a unit), in seconds."""
    match = _IN.match(text)
    if match is None:
        raise InvalidTurn(f"delay {text[:60]!r} is not a duration: use e.g. 90, 90s, 5m, 2h or 1d")
    return float(match[1]) * _UNITS[match[2].lower()]

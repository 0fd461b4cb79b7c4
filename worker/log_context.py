"""Which turn the current thread runs, for the log lines (`worker.ops.logs` adds it to every record).

Below the rooms so that the runner sets it without importing the logging set-up in `worker.ops`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["current_turn", "set_attempt", "turn_context"]

_turn: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("chatq_turn", default=None)


@contextlib.contextmanager
def turn_context(*, turn_id: object, session_id: object, attempt: int | None = None) -> Iterator[None]:
    """Tag every log record of this thread with the turn it is running."""
    token = _turn.set({"turn_id": str(turn_id), "session_id": str(session_id), "attempt": attempt})
    try:
        yield
    finally:
        _turn.reset(token)


def set_attempt(attempt: int) -> None:
    """Record the attempt number once the claim is known."""
    current = _turn.get()
    if current is not None:
        current["attempt"] = attempt


def current_turn() -> dict[str, Any]:
    """The running turn's `turn_id`, `session_id` and `attempt` (empty outside a turn)."""
    return _turn.get() or {}

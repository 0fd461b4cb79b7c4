"""The lifecycle hook that cleans up after turns whose session was deleted while they ran (`worker.deletion`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from sqlalchemy import Engine

from chatq.masking import mask_secrets
from worker.deletion import forget_turns
from worker.runtime.observers import hooks
from worker.store import turns

__all__ = ["ForgetDeletedTurns"]

log = logging.getLogger(__name__)


class ForgetDeletedTurns(hooks.TurnHooks):
    """A turn deleted while it ran (its session was deleted) leaves no replay stream behind.

    Its worker finds the lease lost and stops; the events it published before that would keep
    the stream for CHATQ_EVENT_RETENTION seconds. Only turns that ended lost or cancelled are
    checked (one query each), never those that succeeded or failed.
    """

    def __init__(self, engine: Callable[[], Engine], client: Callable[[], redis.Redis]) -> None:
        self._engine, self._client = engine, client
        """The process's engine and Redis client, asked for when a turn ends (the wiring edge hands them in)."""

    def ended(self, event: hooks.Ended) -> None:
        if event.outcome not in ("lost", "cancelled"):
            return
        turn_id = event.turn.turn_id
        try:
            if not turns.turn_exists(turn_id, engine=self._engine()):
                forget_turns([turn_id], client=self._client())
        except Exception as exc:  # an observer never breaks a turn
            log.warning(
                "turn %s: could not check for a deleted turn: %s",
                turn_id,
                _line(exc),
            )


def _line(exc: BaseException) -> str:
    return (mask_secrets(str(exc)).splitlines() or [type(exc).__name__])[0]

"""Queue items the worker refused (`worker.runtime.intake.intake`), set aside where an operator can read them.

The dead-letter list `chatq.dead` holds the newest DEAD_LETTER_MAX refusals, each a JSON object
(`queue`, `reason`, `bytes`, `at`, and the item itself, cut to DEAD_LETTER_ITEM_CHARS); the list
expires DEAD_LETTER_TTL seconds after the last refusal. Read it with `LRANGE chatq.dead 0 -1`.
No queue is bound to it, so nothing ever consumes it by accident.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from chatq.masking import mask_secrets
from worker.runtime.observers.hook_points import MessageSetAside

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime
from worker.runtime.observers.observers import get_hooks

__all__ = ["DEAD_LETTER_KEY", "DEAD_LETTER_MAX", "DEAD_LETTER_TTL", "notify_refused", "set_aside"]

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = "chatq.dead"
DEAD_LETTER_MAX = 1000
"""Refusals kept; older ones are trimmed away."""
DEAD_LETTER_TTL = 7 * 24 * 3600
"""Seconds the list outlives its newest refusal."""
DEAD_LETTER_ITEM_CHARS = 64 * 1024
"""How much of a refused item is kept: enough to see what sent it, never a whole oversized item."""


def set_aside(client: Any, *, queue: str, raw: bytes | str, reason: str) -> None:
    """Record a refused item in the dead-letter list and count it; never raises."""
    get_hooks().message_set_aside(MessageSetAside(queue=queue, reason=reason))
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    entry = json.dumps(
        {
            "queue": queue,
            "reason": reason,
            "bytes": len(raw),
            "at": datetime.now(UTC).isoformat(),
            "item": text[:DEAD_LETTER_ITEM_CHARS],
        }
    )
    try:
        pipe = client.pipeline(transaction=False)
        pipe.lpush(DEAD_LETTER_KEY, entry).ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTER_MAX - 1)
        pipe.expire(DEAD_LETTER_KEY, DEAD_LETTER_TTL).execute()
    except Exception as exc:  # the refusal stands; only its record is lost
        log.warning("could not record a refused item in %s: %s", DEAD_LETTER_KEY, mask_secrets(str(exc)))


def notify_refused(turn_id: uuid.UUID, session_id: uuid.UUID, reason: str) -> None:
    """Publish the refused turn's `error` event off the consumer thread (it may touch Postgres)."""
    from worker.runtime.delivery.process import current_runtime

    runtime = current_runtime()
    runtime.notifier.submit(_notify, turn_id, session_id, reason, runtime)


def _notify(turn_id: uuid.UUID, session_id: uuid.UUID, reason: str, runtime: Runtime) -> None:
    from worker.runtime.delivery.runner import publish_rejection

    try:
        publish_rejection(turn_id, session_id, reason, runtime=runtime)
    except Exception as exc:
        log.warning("turn %s: could not publish its refusal: %s", turn_id, mask_secrets(str(exc)))

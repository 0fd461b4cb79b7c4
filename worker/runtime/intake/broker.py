"""The Redis broker transport chatq's Celery app uses: kombu's, with the consumer guarded.

Every item BRPOP takes from chatq's queues passes `worker.runtime.intake.intake` before kombu parses it, and one
refused is set aside (`worker.runtime.intake.deadletter`) instead of raising in the consumer loop, where it would
stop the worker (or be restored and stop the next one).

The guard overrides kombu's Redis channel's `_brpop_read` (written against kombu 5.5 to 5.7,
bounded in pyproject.toml); where `_brpop_read` is missing the channel is kombu's own, unguarded,
and the worker logs that once. The channel also reuses one redis-py client per channel
(`chatq.shortcuts.kombu_channel`, a performance shortcut with its own fallback).

Selected with `broker_transport` in `celeryconfig.py`; URLs, options and TLS work as with kombu's.
The item limit comes in the same way, as the transport option `chatq_item_limit` that celeryconfig
derives from the process's settings (kombu's `from_transport_options`): the transport reads none.
"""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from chatq.settings import load_settings
from chatq.shortcuts.kombu_channel import ClientReusingChannel
from worker.payload import GUARDED_QUEUES
from worker.runtime.intake import intake
from worker.runtime.intake.deadletter import notify_refused, set_aside

log = logging.getLogger(__name__)

_GUARDED = hasattr(kombu_redis.Channel, "_brpop_read")

__all__ = ["Channel", "Transport"]


class Channel(ClientReusingChannel):
    """kombu's Redis channel (one client per channel), with each item of chatq's queues checked first."""

    from_transport_options = (*ClientReusingChannel.from_transport_options, "chatq_item_limit")
    chatq_item_limit: int = intake.max_item_bytes(load_settings({}))
    """The largest item let through: the transport option celeryconfig sets, else that of the default limits."""

    if _GUARDED:

        def _brpop_read(self, **options: Any) -> bool:
            """kombu's `_brpop_read` (5.7), with each item of chatq's queues checked before delivery."""
            try:
                try:
                    dest_item = self.client.parse_response(self.client.connection, "BRPOP", **options)
                except self.connection_errors:  # type: ignore[attr-defined]
                    self.client.connection.disconnect()  # the next poll reconnects
                    raise
                if not dest_item:
                    raise Empty()
                dest_raw, item = dest_item
                dest = bytes_to_str(dest_raw).rsplit(self.sep, 1)[0]
                self._queue_cycle.rotate(dest)  # type: ignore[attr-defined]
                payload = self._admit(dest, item)
                if payload is not None:
                    self._deliver_guarded(payload, dest, item)
                return True
            finally:
                self._in_poll = None
                flush = getattr(self, "_flush_brpop_reauth", None)
                if flush is not None:  # kombu 5.7: AUTH a rotated token while BRPOP is idle
                    flush()

    def _admit(self, queue: str, item: bytes) -> dict[str, Any] | None:
        """The parsed envelope of an acceptable item, or None once a refused one is set aside."""
        if queue not in GUARDED_QUEUES:
            return loads(bytes_to_str(item))  # type: ignore[no-any-return]
        verdict = intake.inspect(item, queue=queue, tasks=_task_names(), limit=self.chatq_item_limit)
        if isinstance(verdict, intake.Accepted):
            return verdict.payload
        self._refuse(queue, item, verdict.reason, verdict.turn_id, verdict.session_id)
        return None

    def _deliver_guarded(self, payload: dict[str, Any], queue: str, item: bytes) -> None:
        """Hand an accepted item to kombu and Celery; anything they still cannot take is set aside."""
        try:
            self.connection._deliver(payload, queue)
        except self.connection_errors:  # type: ignore[attr-defined]
            raise
        except Exception as exc:
            # Past intake, nothing should raise here; if something does, the item would stop the
            # worker. It was registered as unacknowledged just before: drop it from there too.
            tag = (payload.get("properties") or {}).get("delivery_tag")
            if tag is not None:
                self.qos.ack(tag)
            self._refuse(queue, item, f"Celery could not take the message: {type(exc).__name__}", None, None)

    def _refuse(self, queue: str, item: bytes, reason: str, turn_id: Any, session_id: Any) -> None:
        log.warning(
            "set aside a malformed message from queue %s (%d bytes, turn %s) in %s: %s",
            queue,
            len(item),
            turn_id or "id not trusted",
            "chatq.dead",
            reason,
        )
        with self.conn_or_acquire() as client:
            set_aside(client, queue=queue, raw=item, reason=reason)
        if turn_id is not None and session_id is not None:
            notify_refused(turn_id, session_id, f"message refused: {reason}")


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel


def _task_names() -> frozenset[str]:
    """chatq's registered tasks: the only ones a chatq queue carries."""
    from worker.app import app

    return frozenset(name for name in app.tasks if name.startswith("chatq."))


if not _GUARDED:
    log.warning("kombu's Redis channel has no _brpop_read: malformed queue items are not guarded")

"""Celery's task-event dispatcher without the lost-event race of Celery 5.5 and 5.6 (a fix, not a speed-up).

With the Redis transport a worker buffers task events (`task-started`, `task-retried`,
`task-succeeded`, ...) and the consumer thread flushes the buffer. Pool threads append to the
buffer without the dispatcher's lock, and Celery 5.5/5.6's `flush` publishes the list and then
empties it in place, so an event appended during the publish is dropped: Flower then shows a
finished turn as STARTED forever (celery/celery#10434, fixed in Celery 5.7, which chatq cannot use
yet: see pyproject.toml). chatq's thread pool hits this on about one retried turn in four.

The fix is Celery 5.7's own: publish a copy and remove only what was published. Written against
Celery 5.5 and 5.6 (tested on 5.6.3); it reads the dispatcher's private `_group_buffer` and calls its
`_publish`. On any other Celery version, or without those, `flush` is Celery's own, logged once.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

from chatq.shortcuts import Gate, minor_version

__all__ = ["GATE", "WRITTEN_FOR", "ChatqEvents", "FlushSafeEventDispatcher"]

_VERSION = metadata.version("celery")

WRITTEN_FOR = ((5, 5), (5, 6))
"""The Celery minor versions (inclusive) this fix was written against."""
HOOKS = ("_group_buffer", "_publish", "mutex")


def _problem() -> str | None:
    version = minor_version(_VERSION)
    if not WRITTEN_FOR[0] <= version <= WRITTEN_FOR[1]:
        return f"celery {_VERSION} is not one of {WRITTEN_FOR} (5.7 fixes the race itself)"
    return None


GATE = Gate("celery_events", _problem)


class FlushSafeEventDispatcher(EventDispatcher):
    """Celery's EventDispatcher whose `flush` keeps the task events appended while it publishes."""

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        missing = [name for name in HOOKS if not hasattr(self, name)]
        if not groups or missing or not GATE.usable():
            super().flush(errors=errors, groups=groups)
            return
        super().flush(errors=errors, groups=False)
        private: Any = self  # the attributes in HOOKS, which Celery's type stubs do not declare
        buffers: dict[str, list[Any]] = private._group_buffer
        with private.mutex:
            for group, events in buffers.items():
                if not events:
                    continue
                # A detached copy: `_publish` re-buffers the object it is given when the broker is
                # down, and other threads keep appending to `events` during the socket write.
                batch = list(events)
                private._publish(batch, private.producer, f"{group}.multi")
                del events[: len(batch)]


class ChatqEvents(Events):
    """`app.events` with the dispatcher above (selected by `Celery(events=...)`, Celery's public hook)."""

    dispatcher_cls = "chatq.shortcuts.celery_events:FlushSafeEventDispatcher"

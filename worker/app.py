"""The Celery app (`worker.app:app`). Creating it does no I/O; settings load on first use."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from celery import Celery


class ChatqCelery(Celery):
    """Celery's app, whose worker application handles stop signals as chatq needs (worker/ops/stopping.py)."""

    @cached_property
    def Worker(self) -> Any:
        """`celery worker`'s application class: Celery's, with signal handlers that only record a stop."""
        from worker.ops.stopping import Worker

        return self.subclass_with_self(Worker)


# worker.runtime.recovery.sweep_timer and .due_timer connect the in-worker sweep's and due steps' signal
# handlers (loaded at worker start, after the app exists); worker.wiring wires the hooks every worker
# runs (metrics, logs, webhooks). They are named here, not imported: they import the runtime, whose
# modules import this app.
# ChatqEvents: Celery's task-event dispatcher without the race that drops events (chatq.shortcuts.celery_events).
app = ChatqCelery(
    "chatq",
    include=[
        "worker.runtime.intake.tasks",
        "worker.runtime.recovery.sweep_timer",
        "worker.runtime.recovery.due_timer",
        "worker.wiring",
    ],
    events="chatq.shortcuts.celery_events:ChatqEvents",
)
app.config_from_object("celeryconfig")

import worker.ops.signals  # noqa: E402, F401  (connects logging, preload, metrics and shutdown handlers)

__all__ = ["app"]

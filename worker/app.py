"""The Celery app (`worker.app:app`). Creating it does no I/O; settings load on first use."""

from __future__ import annotations

from celery import Celery

# worker.runtime.sweep_timer connects the in-worker sweep's signal handlers (loaded at worker start,
# after the app exists).
# ChatqEvents: Celery's task-event dispatcher without the race that drops events (chatq.shortcuts.celery_events).
app = Celery(
    "chatq",
    include=["worker.runtime.tasks", "worker.runtime.sweep_timer"],
    events="chatq.shortcuts.celery_events:ChatqEvents",
)
app.config_from_object("celeryconfig")

import worker.ops.signals  # noqa: E402, F401  (connects logging, preload, metrics and shutdown handlers)

__all__ = ["app"]

"""The Celery app (`worker.app:app`). Creating it does no I/O; settings load on first use."""

from __future__ import annotations

from celery import Celery

# worker.sweep_timer connects the in-worker sweep's signal handlers (loaded at worker start, after the app exists).
app = Celery("chatq", include=["worker.tasks", "worker.sweep_timer"])
app.config_from_object("celeryconfig")

import worker.signals  # noqa: E402, F401  (connects logging, preload, metrics and shutdown handlers)

__all__ = ["app"]

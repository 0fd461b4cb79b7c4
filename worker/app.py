"""The Celery app (`worker.app:app`). Creating it does no I/O; settings load on first use."""

from __future__ import annotations

from celery import Celery

app = Celery("chatq", include=["worker.tasks"])
app.config_from_object("celeryconfig")

import worker.signals  # noqa: E402, F401  (connects logging, preload, metrics and shutdown handlers)

__all__ = ["app"]

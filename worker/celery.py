"""Lets `celery -A worker ...` find the app (Celery looks for `<package>.celery`)."""

from worker.app import app

__all__ = ["app"]

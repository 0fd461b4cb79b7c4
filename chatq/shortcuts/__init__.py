"""Shortcuts through other libraries' private parts, fenced in one place: one module per library.

- `kombu_channel`: kombu's Redis channel reusing one redis-py client per channel.
- `redis_resp`: stream-event commands packed once and sent on a pooled redis-py connection.
- `openai_client`: an openai SDK client that keeps streamed chunks as dicts and posts plain-JSON
  bodies as they are.
- `celery_events`: a fix, not a speed-up: Celery 5.5/5.6's task-event dispatcher without the race
  that drops events appended while it flushes (Flower showed finished turns as STARTED).

Each speed-up was measured against the library's public API (BENCHMARKS.md, "Shortcuts through other
libraries") and is taken only on the library versions it was written against and while the
private parts it uses exist; otherwise its module uses the public API and logs that once at INFO.
Each module's `ENABLED` switch selects the public API as well (benchmarks and tests compare both).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Gate", "minor_version"]

log = logging.getLogger(__name__)


def minor_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "5.7.0" or "3.57.0rc1"; (0, 0) if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        return (0, 0)


class Gate:
    """Whether one shortcut is taken: its library's version is in range and its hooks exist.

    `problem` is checked once, on first use, and the public API's use is logged once at INFO.
    """

    def __init__(self, name: str, problem: Callable[[], str | None]) -> None:
        self.name = name
        self._problem = problem
        self._usable: bool | None = None
        self._lock = threading.Lock()

    def usable(self) -> bool:
        """True when the shortcut may be taken (the library matches what it was written against)."""
        if self._usable is None:
            with self._lock:
                if self._usable is None:
                    problem = self._problem()
                    if problem is not None:
                        log.info("shortcut %s not taken, using the public API: %s", self.name, problem)
                    self._usable = problem is None
        return self._usable

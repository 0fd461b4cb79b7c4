"""Process-wide state, owned in one place: values built lazily once per process, rebuilt after fork.

What a turn uses for the life of the process is a `PerProcess`: the settings (`chatq.settings`),
the engines (`models.db`), the Redis client and the text flusher (`worker.events`), the lease keeper,
the hooks, the refusal notifier and the `Runtime` that gathers them (`worker.runtime`). Nothing is
built at import time. A forked child (Celery prefork, multiprocessing) never uses its parent's
value: it builds its own on first use, after `inherited` lets go of the parent's without closing
what the parent still uses (SQLAlchemy's "Using Connection Pools with Multiprocessing or
os.fork()"). Tests that switch databases or environments reset the value they change
(`reset_settings`, `dispose_engine`, `reset_redis`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")

_every: weakref.WeakSet[PerProcess[object]] = weakref.WeakSet()


class PerProcess(Generic[T]):
    """One value per process, built by `build` on first use."""

    def __init__(
        self,
        build: Callable[[], T],
        *,
        close: Callable[[T], None] | None = None,
        inherited: Callable[[T], None] | None = None,
    ) -> None:
        """`close` ends the value on `reset`; `inherited` releases a parent's value in a forked child."""
        self._build = build
        self._close = close
        self._inherited = inherited
        self._slot: tuple[int, T] | None = None
        self._lock = threading.Lock()
        _every.add(self)  # type: ignore[arg-type]

    def get(self) -> T:
        """This process's value, built now if it has none."""
        slot = self._slot
        pid = os.getpid()
        if slot is not None and slot[0] == pid:
            return slot[1]
        with self._lock:
            slot = self._slot
            if slot is not None and slot[0] == pid:
                return slot[1]
            if slot is not None and self._inherited is not None:
                self._inherited(slot[1])
            value = self._build()
            self._slot = (pid, value)
            return value

    def built(self) -> T | None:
        """This process's value if it was built, without building it."""
        slot = self._slot
        return slot[1] if slot is not None and slot[0] == os.getpid() else None

    def reset(self) -> None:
        """Forget the value (closing it when this process built it); the next `get` builds a new one."""
        with self._lock:
            slot, self._slot = self._slot, None
        if slot is not None and slot[0] == os.getpid() and self._close is not None:
            self._close(slot[1])

    def _after_fork(self) -> None:
        # A lock some other thread of the parent held at the fork would never be released here.
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for value in list(_every):
        value._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

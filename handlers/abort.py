"""An abort signal for the model request a turn is waiting on (no framework imports).

Checking a flag between chunks cannot stop a model that sends nothing: the thread sits in a
socket read until the next chunk or the turn timeout. So the worker hands each running turn an
`AbortSignal` (`abortable(signal)` around the handler's stream) and another thread (the lease
keeper seeing a cancel, a worker shutting down) calls `abort()`. Whatever blocks on the model
registers how to stop itself with `current_abort().on_abort(...)` for as long as it blocks:
`handlers.abortable_http`'s transport shuts the request's socket down, so the read returns at
once and the adapter's call fails with a connection error, which the worker reports as the
cancel (or hand-back) it was.

A context variable carries the signal, so the graph's greenlet and the tool threads that copy the
turn's context see the same signal; code running outside a turn sees None.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["AbortSignal", "abortable", "current_abort"]

log = logging.getLogger(__name__)


class AbortSignal:
    """Set once by `abort(reason)`; the callbacks registered at that moment are called on the aborting thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    @property
    def aborted(self) -> bool:
        """Whether `abort()` was called."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why it was aborted (None while it was not)."""
        return self._reason

    def abort(self, reason: str) -> None:
        """Abort (the first reason stays): call every registered callback once; later registrations run at once."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:
            _call(callback)

    @contextlib.contextmanager
    def on_abort(self, callback: Callable[[], None]) -> Iterator[None]:
        """`callback` is called if the signal is aborted while the block runs (at once if it already was)."""
        key = self.watch(callback)
        try:
            yield
        finally:
            self.unwatch(key)

    def watch(self, callback: Callable[[], None]) -> int:
        """Register `callback` until `unwatch(key)` (called at once if already aborted); returns the key.

        `on_abort` without the context manager, for a hot path (a socket read per streamed chunk).
        """
        with self._lock:
            key = next(self._ids)
            already = self._reason is not None
            if not already:
                self._callbacks[key] = callback
        if already:
            _call(callback)
        return key

    def unwatch(self, key: int) -> None:
        """Forget the callback `watch` returned `key` for (no error when it already ran)."""
        with self._lock:
            self._callbacks.pop(key, None)


def _call(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception as exc:  # one failing stop must not keep the others from running
        log.debug("an abort callback raised, ignored: %s: %s", type(exc).__name__, exc)


_signal: ContextVar[AbortSignal | None] = ContextVar("chatq_abort", default=None)


@contextlib.contextmanager
def abortable(signal: AbortSignal) -> Iterator[AbortSignal]:
    """Make `signal` the current abort signal inside the block (the worker's side, around a handler)."""
    token = _signal.set(signal)
    try:
        yield signal
    finally:
        _signal.reset(token)


def current_abort() -> AbortSignal | None:
    """The signal of the turn this code runs for, if any."""
    return _signal.get()

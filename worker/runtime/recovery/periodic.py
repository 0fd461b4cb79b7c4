"""A daemon thread that runs a round every `interval` seconds until asked to stop.

What the sweep timer and the due timer (worker/runtime/recovery/{sweep_timer,due_timer}.py) share:
the first round at once, then one every interval; `stop` only asks (it is called from the
chatq-stop thread during a warm shutdown and must not wait); `join` waits a bounded time at the
end. A round must never raise: each timer logs its own failures in `run_round`.
"""

from __future__ import annotations

import threading

STOP_TIMEOUT = 5.0
"""Seconds shutdown waits for a round in progress before leaving the daemon thread behind."""


class PeriodicThread:
    """Runs `run_round` every `interval` seconds on a daemon thread named `name` until `stop`."""

    def __init__(self, *, interval: float, name: str) -> None:
        self.interval = interval
        self._name = name
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after the round in progress, if any; returns at once."""
        self._stopping.set()

    def join(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Wait until the thread ended; False if it still runs after `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def run_round(self) -> object:
        """One round (subclasses); logs its own errors, never raises."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.run_round()
            self._stopping.wait(self.interval)

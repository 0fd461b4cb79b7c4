"""The turn timeout as a monotonic deadline, shared by every framework adapter (no framework imports)."""

from __future__ import annotations

import threading
import time

from handlers.errors import AgentInvocationError, TurnTimeout

__all__ = ["Deadline"]


class Deadline:
    """The turn timeout as a monotonic deadline, checked between streamed events and model calls.

    It also carries a stop flag: a consumer that stops reading (a cancelled turn, a worker shutting
    down) calls `stop()`, and work still running on other threads ends at its next check instead
    of streaming on until the timeout.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expires_at = time.monotonic() + seconds
        self._stopped = threading.Event()

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(self.expires_at - time.monotonic(), 0.0)

    def stop(self) -> None:
        """Make every later `check()` fail: nobody is waiting for the result any more."""
        self._stopped.set()

    def check(self) -> None:
        """Raise TurnTimeout once the deadline has passed, AgentInvocationError once stopped."""
        if self._stopped.is_set():
            raise AgentInvocationError("The invocation was stopped.")
        if time.monotonic() >= self.expires_at:
            raise TurnTimeout(f"The model did not answer within the turn timeout ({self.seconds:g} s).")

"""The process's hook registry (`worker.runtime.observers.hooks`), filled by the edge that wires the process.

Which observers a worker runs (the metrics and log lines of `worker.ops`, webhooks, ...) is decided
above the rooms, in `worker.wiring`, which the Celery app loads with its task modules: the runtime
calls its hooks without knowing them, and never imports `worker.ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chatq.per_process import PerProcess
from worker.errors import HooksNotWired
from worker.runtime.observers.hooks import HookRegistry, TurnHooks

__all__ = ["get_hooks", "wire"]

_factory: Callable[[], Sequence[TurnHooks]] | None = None


def wire(factory: Callable[[], Sequence[TurnHooks]]) -> None:
    """Build the process's registry from `factory` (on first use); `worker.wiring` calls it once."""
    global _factory
    _factory = factory
    _registry.reset()


def _build() -> HookRegistry:
    if _factory is None:
        # A worker without its observers would run turns that no metric, log line or webhook sees.
        raise HooksNotWired()
    return HookRegistry(_factory())


_registry: PerProcess[HookRegistry] = PerProcess(_build)


def get_hooks() -> HookRegistry:
    """The process's registry, built from the wired factory on first use; HooksNotWired before wiring."""
    return _registry.get()

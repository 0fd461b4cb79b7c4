"""The process's hooks: which observers every worker runs on each turn (`worker.runtime.hooks`).

Apart from `worker.runtime.hooks` so that the hooks themselves (`worker.ops.metrics`, `worker.ops.logs`) can
build on its base class without an import cycle.
"""

from __future__ import annotations

from chatq.per_process import PerProcess
from worker.ops.logs import LogHooks
from worker.ops.metrics import MetricsHooks
from worker.runtime.hooks import HookRegistry, TurnHooks
from worker.runtime.webhooks import WebhookHooks


def default_hooks() -> list[TurnHooks]:
    """The hooks every worker runs, in order: Prometheus metrics, the per-turn log lines, webhook
    deliveries, then the clean-up after turns whose session was deleted under them.

    A new observer is one more `TurnHooks` subclass appended here.
    """
    from worker.runtime.deletion import ForgetDeletedTurns

    return [MetricsHooks(), LogHooks(), WebhookHooks(), ForgetDeletedTurns()]


_registry: PerProcess[HookRegistry] = PerProcess(lambda: HookRegistry(default_hooks()))


def get_hooks() -> HookRegistry:
    """The process's registry, built from `default_hooks()` on first use."""
    return _registry.get()

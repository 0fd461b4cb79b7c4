"""Which hooks every worker runs: the edge above the runtime and ops that joins them.

The runtime calls named hook points (`worker.runtime.observers.hooks`, `worker.runtime.observers.hook_points`) and ops
implements them (`worker.ops.metrics`, `worker.ops.logs`); neither imports the other. Importing
this module wires the process (`worker.runtime.observers.observers.wire`: it stores a function, builds
nothing); the Celery app includes it beside its task modules, so every worker process loads it.
"""

from __future__ import annotations

from chatq.settings import get_settings
from models.db import get_engine
from worker.events import get_redis
from worker.ops.logs import LogHooks
from worker.ops.metrics import MetricsHooks
from worker.runtime.observers import observers
from worker.runtime.observers.budget_hooks import BudgetHooks
from worker.runtime.observers.deleted_turns import ForgetDeletedTurns
from worker.runtime.observers.hooks import HookRegistry, TurnHooks
from worker.runtime.webhooks.deliveries import WebhookHooks

__all__ = ["default_hooks", "get_hooks"]


def default_hooks() -> list[TurnHooks]:
    """The hooks every worker runs, in order: Prometheus metrics, the per-turn log lines, the tenant
    budget counters, webhook deliveries, then the clean-up after turns whose session was deleted under them.

    A new observer is one more `TurnHooks` subclass appended here.
    """
    return [
        MetricsHooks(),
        LogHooks(),
        BudgetHooks(get_settings, get_redis, get_engine),
        WebhookHooks(get_engine),
        ForgetDeletedTurns(get_engine, get_redis),
    ]


def get_hooks() -> HookRegistry:
    """The process's registry (`worker.runtime.observers.observers.get_hooks`), wired with `default_hooks()`."""
    return observers.get_hooks()


observers.wire(default_hooks)

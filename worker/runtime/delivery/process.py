"""What one worker process shares across its turns, handed to the runner as one object.

A `Runtime` holds the process's settings, hooks, lease keeper, engine and Redis client as values.
It is built at the edges only: `current_runtime()` at the Celery task entry (`worker.runtime.intake`)
and the worker's signal handlers, the in-process test harness builds its own. Everything below
(the runner, the store, the provider's limits, webhooks, recovery) takes it, or the connections
on it, as an argument and fetches no global. Each part is a `chatq.per_process` value, built on
first use and again after a fork; a test that resets the settings, or switches databases, gets a
runtime built from the new ones.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis
from sqlalchemy import Engine

from chatq.per_process import PerProcess
from chatq.settings import Settings, get_settings
from handlers.handler_settings import HandlerSettings
from models.db import get_engine
from worker.events import get_redis
from worker.runtime.observers.hooks import HookRegistry
from worker.runtime.observers.observers import get_hooks
from worker.runtime.policy.retry import RetryPolicy
from worker.runtime.recovery.leases import LeaseKeeper, get_lease_keeper

__all__ = ["Runtime", "current_runtime"]


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """A worker process's shared parts."""

    settings: Settings
    """The process's settings (`chatq.settings.get_settings()`)."""
    hooks: HookRegistry
    """The lifecycle hooks every turn calls (`worker.runtime.observers.observers`)."""
    leases: LeaseKeeper
    """Renews the leases of the turns this process runs."""
    retry: RetryPolicy
    """Whether and when a delivery is tried again, from `settings`."""
    engine: Engine
    """The pooled engine every Postgres statement of a turn runs on (`models.db.get_engine()` in a worker)."""
    redis: redis.Redis
    """The Redis client events, markers and the shared limits use (`worker.events.get_redis()` in a worker)."""

    @property
    def handler_settings(self) -> HandlerSettings:
        """What handlers/ needs of `settings` (model, timeouts, budgets, endpoint, tool settings), handed
        to `build_turn_input` for each turn: handlers/ reads no settings of its own."""
        return HandlerSettings.of(self.settings)

    @property
    def notifier(self) -> ThreadPoolExecutor:
        """The one thread that publishes refusals off the consumer's thread (`worker.runtime.intake.deadletter`)."""
        return _notifier.get()


def _build() -> Runtime:
    settings = get_settings()
    engine = get_engine()
    return Runtime(
        settings=settings,
        hooks=get_hooks(),
        leases=get_lease_keeper(settings, engine),
        retry=RetryPolicy.from_settings(settings),
        engine=engine,
        redis=get_redis(),
    )


_runtime: PerProcess[Runtime] = PerProcess(_build)
_notifier: PerProcess[ThreadPoolExecutor] = PerProcess(
    lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatq-refusals"),
    close=lambda executor: executor.shutdown(wait=False),
)


def current_runtime() -> Runtime:
    """This process's runtime (for the edges only); rebuilt when the settings or connections were reset since."""
    runtime = _runtime.get()
    if runtime.settings is not get_settings() or runtime.engine is not get_engine() or runtime.redis is not get_redis():
        _runtime.reset()
        runtime = _runtime.get()
    return runtime

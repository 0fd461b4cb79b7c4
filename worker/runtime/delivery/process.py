"""What one worker process shares across its turns, handed to the runner as one object.

`current_runtime()` gathers the process's settings, hooks, lease keeper, database, Redis client and
refusal notifier; the `chatq.run_turn` task takes it once per delivery and the runner and claims use
what they are given instead of fetching globals. Each part is a `chatq.per_process` value, built on
first use and again after a fork; a test that resets the settings gets a runtime built from the new
ones.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from chatq.per_process import PerProcess
from chatq.settings import Settings, get_settings
from models.db import get_engine, get_sessionmaker
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

    @property
    def engine(self) -> Engine:
        """The process's pooled engine (`models.db`; rebuilt when a test switches databases)."""
        return get_engine()

    @property
    def sessions(self) -> sessionmaker[Session]:
        """The session factory bound to `engine`."""
        return get_sessionmaker()

    @property
    def redis(self) -> redis.Redis:
        """The process's Redis client (`worker.events`)."""
        return get_redis()

    @property
    def notifier(self) -> ThreadPoolExecutor:
        """The one thread that publishes refusals off the consumer's thread (`worker.runtime.intake.deadletter`)."""
        return _notifier.get()


def _build() -> Runtime:
    settings = get_settings()
    return Runtime(
        settings=settings,
        hooks=get_hooks(),
        leases=get_lease_keeper(),
        retry=RetryPolicy.from_settings(settings),
    )


_runtime: PerProcess[Runtime] = PerProcess(_build)
_notifier: PerProcess[ThreadPoolExecutor] = PerProcess(
    lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatq-refusals"),
    close=lambda executor: executor.shutdown(wait=False),
)


def current_runtime() -> Runtime:
    """This process's runtime; rebuilt when the settings were reset since it was built."""
    runtime = _runtime.get()
    if runtime.settings is not get_settings():
        _runtime.reset()
        runtime = _runtime.get()
    return runtime

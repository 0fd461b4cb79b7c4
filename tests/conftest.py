"""Shared fixtures: an isolated database and Redis db per test run, wired into chatq's settings."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import worker.wiring  # noqa: F401  (wires the process's hooks, as the Celery app does in a worker)
from tests.support.env import environ
from tests.support.services import fresh_database, private_redis_db

pytest_plugins = ["tests.support.fixtures"]

# The `chatq` processes the suite starts run in the checkout, where a developer may keep a `.env`
# (docker compose's) or `.local/services.env`: they read no env file, only what each test sets.
os.environ["CHATQ_ENV_FILES"] = ""

ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In each package, the tests marked slow (real workers, processes) run after the others.

    A package's real worker (a package-scoped fixture) then starts after its in-process tests
    (tests/support/inprocess.py), which must not share the test's Redis queues with it, and a
    run stopped early has run the quick tests first.
    """
    packages: dict[str, int] = {}
    for item in items:
        packages.setdefault(item.path.parent.as_posix(), len(packages))
    items.sort(key=lambda item: (packages[item.path.parent.as_posix()], item.get_closest_marker("slow") is not None))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_share_group(item)))


def _share_group(item: pytest.Item) -> str:
    """What must run in one test process, in the order above, when `make test` runs several
    (pytest-xdist's `--dist loadgroup`): an integration package, whose package-scoped worker or
    gateway must not run beside its in-process tests; a fault module, each on its own workers."""
    parts = item.path.relative_to(ROOT).parts
    if parts[:2] == ("tests", "faults"):
        return item.path.relative_to(ROOT).as_posix()
    return item.path.parent.relative_to(ROOT).as_posix()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name the test being set up before its fixtures start anything (tests.support.workers checks
    that a test starting a real worker is marked slow)."""
    from tests.support.workers import running_test

    running_test.item = item


@pytest.fixture(autouse=True)
def _test_started() -> None:
    """Note when each test starts (tests.support.broker counts only messages taken since)."""
    from tests.support.broker import test_clock

    test_clock.started = time.time()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A migrated database of this test run's own; DATABASE_URL points at it."""
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis logical database of this test run's own; REDIS_URL points at it."""
    with private_redis_db() as url:
        yield url


@pytest.fixture(scope="session")
def chatq_env(database_url: str, redis_url: str) -> Iterator[dict[str, str]]:
    """Point this process's chatq settings at the test database and Redis."""
    from models.db import dispose_engine
    from worker.app import app
    from worker.events import reset_redis

    with environ(DATABASE_URL=database_url, REDIS_URL=redis_url):
        dispose_engine()
        reset_redis()
        app.conf.broker_url = redis_url
        yield {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
        reset_redis()
        dispose_engine()

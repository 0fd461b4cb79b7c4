"""Shared fixtures: an isolated database and Redis db per test run, wired into chatq's settings."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

import worker.wiring  # noqa: F401  (wires the process's hooks, as the Celery app does in a worker)
from tests.support.env import environ
from tests.support.services import fresh_database, private_redis_db


def pytest_configure(config: pytest.Config) -> None:
    # Tests press Ctrl-C on the workers and commands they start (SIGINT). A suite started in the
    # background by a non-interactive shell (`make test &`, a CI runner) inherits SIGINT ignored,
    # and an ignored signal stays ignored across exec: a child would not hear a Ctrl-C until it
    # installs a handler of its own (a worker's first seconds, `chatq batch` never), as it would
    # from a terminal. Children start from Python's default, as under a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


pytest_plugins = ["tests.support.fixtures"]

# The `chatq` processes the suite starts run in the checkout, where a developer may keep a `.env`
# (docker compose's) or `.local/services.env`: they read no env file, only what each test sets.
os.environ["CHATQ_ENV_FILES"] = ""


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """When `make test` runs the suite on several processes (pytest-xdist), send each process whole
    groups (`share_group`), in the order collected: the fault modules, the slowest, first."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return share_group(nodeid)

    # pytest-xdist's own `xdist_group` marks cannot be used: pytest 9 ignores how it renames tests.
    config.option.loadscopereorder = False  # the collection's order, not the groups' sizes
    return GroupScheduling(config, log)  # type: ignore[arg-type]


def share_group(nodeid: str) -> str:
    """What must run in one test process, in the order above: an integration package, whose
    package-scoped worker or gateway must not run beside its in-process tests; a fault module
    (each starts workers of its own); a unit test package."""
    path = nodeid.split("::", 1)[0]
    return path if path.startswith("tests/faults/") else path.rsplit("/", 1)[0]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name the test being set up before its fixtures start anything (tests.support.workers checks
    that a test starting a real worker is marked slow)."""
    from tests.support.workers import running_test

    running_test.item = item


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many real workers each test file started (tests.support.workers; the pytest-xdist
    processes' own counts are not seen here)."""
    from tests.support.workers import launches

    if launches:
        terminalreporter.write_sep("-", f"real worker start-ups: {sum(launches.values())}")
        for path, count in launches.most_common():
            terminalreporter.write_line(f"{count:4d} {path}")


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

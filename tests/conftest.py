"""Shared fixtures: an isolated database and Redis db per test run, wired into chatq's settings."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.services import fresh_database, private_redis_db

pytest_plugins = ["tests.support.fixtures"]


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
    from worker.config import reset_settings

    saved = {k: os.environ.get(k) for k in ("DATABASE_URL", "REDIS_URL")}
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    reset_settings()
    dispose_engine()
    from worker.app import app
    from worker.events import reset_redis

    reset_redis()
    app.conf.broker_url = redis_url
    yield {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    reset_redis()
    dispose_engine()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    reset_settings()

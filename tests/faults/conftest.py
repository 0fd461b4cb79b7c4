"""Fixtures of the fault tests: worker and beat subprocesses, service restarts, cleanup.

Every process a test starts is killed at its teardown, every service it stops is started again,
and turns it left unfinished are cancelled in Postgres so no later test's sweeper picks them up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from models.db import session_scope
from models.tables import ACTIVE_STATUSES, Turn, TurnStatus
from tests.faults.helpers import (
    Beat,
    PostgresControl,
    RedisControl,
    Workers,
    postgres_control,
    read_db,
    redis_control,
)
from tests.support.openai_stub import OpenAIStub


@pytest.fixture(scope="session")
def worker_env(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> dict[str, str]:
    """The environment of worker and beat subprocesses: test database, Redis db and the model stub."""
    return {**chatq_env, "OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


def _now() -> datetime:
    with session_scope() as db:
        return db.execute(select(func.now())).scalar_one()


@pytest.fixture(autouse=True)
def _cancel_leftover_turns(chatq_env: dict[str, str]) -> Iterator[None]:
    """Turns a test leaves unfinished (it failed) are cancelled, so later sweepers leave them alone."""
    started = read_db(_now)
    yield
    with contextlib.suppress(Exception), session_scope() as db:
        db.execute(
            update(Turn)
            .where(Turn.created_at >= started, Turn.status.in_(ACTIVE_STATUSES))
            .values(status=TurnStatus.CANCELLED, lease_token=None, lease_expires_at=None, finished_at=func.now())
        )


@pytest.fixture
def workers(worker_env: dict[str, str]) -> Iterator[Workers]:
    """Start workers with `workers.start(n)` / `workers.one()`; all are killed (-9) at teardown."""
    pool = Workers(worker_env)
    try:
        yield pool
    finally:
        pool.kill_all()
        print(pool.logs())  # shown only when the test failed


@pytest.fixture
def beat_process(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Beat]:
    """A `chatq beat` not started yet (call .start()), with a private schedule; killed at teardown."""
    beat = Beat(worker_env, tmp_path / "beat")
    try:
        yield beat
    finally:
        beat.kill()
        print(f"--- beat (started {beat.starts}x) ---\n{beat.log()[-3000:]}")


@pytest.fixture
def beat(beat_process: Beat) -> Beat:
    """A running `chatq beat` (the sweeper every CHATQ_SWEEP_INTERVAL s)."""
    return beat_process.start()


@pytest.fixture
def postgres(database_url: str) -> Iterator[PostgresControl]:
    """Restart control of the test database's Postgres; it is running again after the test."""
    control = postgres_control(database_url)
    if isinstance(control, str):
        pytest.skip(f"cannot restart Postgres here: {control}")
    if not control.ready():
        pytest.skip(f"Postgres ({control.description}) is not answering pg_isready")
    try:
        yield control
    finally:
        control.ensure_running()


@pytest.fixture
def redis_server(redis_url: str) -> Iterator[RedisControl]:
    """Restart control of the test's Redis; it is running again (other dbs put back) after the test."""
    control = redis_control(redis_url)
    if isinstance(control, str):
        pytest.skip(f"cannot restart Redis here: {control}")
    if not control.ready():
        pytest.skip("Redis is not answering PING")
    try:
        yield control
    finally:
        control.ensure_running()

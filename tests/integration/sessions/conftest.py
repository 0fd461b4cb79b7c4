"""Fixtures for the session tests: a real worker (started only by the tests that use it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.worker.conftest import STUB_MODEL, worker_env
from tests.support.workers import WorkerProcess, shared_worker

__all__ = ["STUB_MODEL", "worker", "worker_env"]


@pytest.fixture(scope="package")
def worker(worker_env: dict[str, str]) -> Iterator[WorkerProcess]:
    """One real `chatq worker` for the package's tests that use it."""
    yield from shared_worker(worker_env)

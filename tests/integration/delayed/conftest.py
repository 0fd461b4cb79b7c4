"""The real worker of this package's one slow test (its in-process tests run first: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.worker.conftest import worker_env
from tests.support.workers import WorkerProcess, shared_worker

__all__ = ["worker", "worker_env"]


@pytest.fixture(scope="package")
def worker(worker_env: dict[str, str]) -> Iterator[WorkerProcess]:
    """One real `chatq worker`, with its due timer (CHATQ_DUE_INTERVAL's default, 1 s)."""
    yield from shared_worker(worker_env)

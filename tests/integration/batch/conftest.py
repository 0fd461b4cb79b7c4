"""Two real workers for the batch tests (stopped after the package)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.openai_stub import OpenAIStub
from tests.support.workers import WorkerProcess


@pytest.fixture(scope="package")
def batch_env(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> dict[str, str]:
    return {**chatq_env, "OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


@pytest.fixture(scope="package")
def two_workers(batch_env: dict[str, str]) -> Iterator[list[WorkerProcess]]:
    workers = [WorkerProcess(batch_env, concurrency=8).start() for _ in range(2)]
    yield workers
    for worker in workers:
        worker.stop()

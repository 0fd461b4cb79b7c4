"""Fixtures for tests that run turns through a real Celery worker and the OpenAI-compatible stub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.openai_stub import OpenAIStub
from tests.support.workers import WorkerProcess, shared_worker

STUB_MODEL = "gpt-4o-mini"


@pytest.fixture(scope="session")
def worker_env(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> dict[str, str]:
    """The environment of worker subprocesses: test database, Redis db and the model stub."""
    return {**chatq_env, "OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


@pytest.fixture(scope="package")
def worker(worker_env: dict[str, str]) -> Iterator[WorkerProcess]:
    """One real `chatq worker` shared by the tests of this package (and stopped after them, so
    workers of other packages' tests never compete for the same queue). The package's in-process
    tests run before it starts (tests/conftest.py orders the slow ones last)."""
    yield from shared_worker(worker_env)

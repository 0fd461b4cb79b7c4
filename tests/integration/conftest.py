"""Turns run in the test process (tests/support/inprocess.py): the default for tests about what a turn does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.inprocess import InProcessWorker, in_process_worker
from tests.support.openai_stub import OpenAIStub

IN_PROCESS_API_KEY = "sk-test-not-a-secret"
"""The key the in-process runtime sends to the model stub (the real test workers' key)."""


@pytest.fixture
def in_process_env() -> dict[str, str]:
    """Settings of the in-process runtime beyond the test workers' (a module overrides this fixture)."""
    return {}


@pytest.fixture
def in_process(
    chatq_env: dict[str, str], openai_stub: OpenAIStub, in_process_env: dict[str, str]
) -> Iterator[InProcessWorker]:
    """Runs the turns (and webhook deliveries) this test queues, in this process, as a real worker would."""
    with in_process_worker(
        chatq_env["REDIS_URL"],
        OPENAI_BASE_URL=openai_stub.base_url,
        OPENAI_API_KEY=IN_PROCESS_API_KEY,
        **in_process_env,
    ) as runner:
        yield runner

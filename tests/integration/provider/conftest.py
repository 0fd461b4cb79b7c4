"""Fixtures for turns against a stub that behaves like a rate-limited provider, run by real workers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.openai_stub import OpenAIStub
from tests.support.workers import WorkerProcess

CAPPED_MODEL = "capped-model"
"""A model name configured with `max_concurrent: 2` in the workers' CHATQ_MODEL_LIMITS."""
PACED_MODEL = "paced-model"
"""A model name configured with `rpm: 120`."""
SOLO_MODEL = "solo-model"
"""A model name configured with `max_concurrent: 1`."""
PAIR_MODEL = "pair-model"
"""A model name configured with `max_concurrent: 2`, used by one test only (its history of request times is its own)."""
PATIENCE = 8.0
"""The workers' CHATQ_PROVIDER_PATIENCE (seconds)."""
MODEL_LIMITS = {
    SOLO_MODEL: {"max_concurrent": 1},
    CAPPED_MODEL: {"max_concurrent": 2},
    PAIR_MODEL: {"max_concurrent": 2},
    PACED_MODEL: {"rpm": 120},
}


@pytest.fixture(scope="package")
def provider_stub() -> Iterator[OpenAIStub]:
    """A stub of this package's own; a test sets its `limits` and resets them after."""
    with OpenAIStub() as stub:
        yield stub


@pytest.fixture
def provider(provider_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """The stub, cleared, with no server-wide limits unless the test sets `limits`."""
    provider_stub.clear()
    provider_stub.limits = None
    yield provider_stub
    provider_stub.limits = None


@pytest.fixture(scope="package")
def provider_env(chatq_env: dict[str, str], provider_stub: OpenAIStub) -> dict[str, str]:
    """Workers' environment: the stub as the model service, and this package's model limits."""
    return {
        **chatq_env,
        "OPENAI_BASE_URL": provider_stub.base_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "CHATQ_MODEL_LIMITS": json.dumps(MODEL_LIMITS),
        "CHATQ_TURN_TIMEOUT": "5",
        "CHATQ_PROVIDER_PATIENCE": str(PATIENCE),
    }


@pytest.fixture(scope="package")
def workers(provider_env: dict[str, str]) -> Iterator[list[WorkerProcess]]:
    """Two worker processes sharing the limits through Redis."""
    processes = [WorkerProcess(provider_env, concurrency=4).launch() for _ in range(2)]
    try:
        for process in processes:
            process.wait_ready()
        yield processes
    finally:
        for process in processes:
            process.stop()

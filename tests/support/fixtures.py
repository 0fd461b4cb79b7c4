"""Fixtures for handler tests: a shared OpenAI-compatible stub and settings that point at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.env import environ
from tests.support.openai_stub import OpenAIStub

STUB_API_KEY = "sk-test-stub-key"
"""The API key the handlers send to the stub (tests assert it never shows up in errors or logs)."""


@pytest.fixture(scope="session")
def openai_stub() -> Iterator[OpenAIStub]:
    """One stub server for the whole run; tests script it through directives in their own messages."""
    with OpenAIStub() as stub:
        yield stub


@pytest.fixture
def stub_env(openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """OPENAI_BASE_URL/OPENAI_API_KEY point at the stub, settings re-read; restored afterwards."""
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY):
        yield openai_stub


@pytest.fixture
def drop_sent_messages(redis_url: str) -> Iterator[None]:
    """Remove the task messages a test sent with no worker to consume them (a next turn, a retry, a
    webhook delivery): a later package's workers would run them against their own model stub."""
    yield
    from worker.payload import GUARDED_QUEUES

    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()

"""Fixtures of the webhook tests: real receivers, real workers, and the model stub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.env import environ
from tests.support.openai_stub import OpenAIStub
from tests.support.receiver import Receiver

STUB_MODEL = "gpt-4o-mini"
SECRET = "whsec-test-only-0123456789"
"""CHATQ_WEBHOOK_SECRET of the workers these tests start."""


@pytest.fixture(scope="session")
def worker_env(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> dict[str, str]:
    """The environment of worker subprocesses: test database, Redis db and the model stub."""
    return {**chatq_env, "OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local webhook receiver, stopped (its held requests released) after the test."""
    with Receiver() as server:
        yield server


@pytest.fixture
def allow_private() -> Iterator[None]:
    """This process accepts webhooks on 127.0.0.1 (where the receivers listen), as the workers here do."""
    with environ(CHATQ_WEBHOOK_ALLOW_PRIVATE="1"):
        yield

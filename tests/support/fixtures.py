"""Fixtures for handler tests: a shared OpenAI-compatible stub and settings that point at it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.openai_stub import OpenAIStub

STUB_API_KEY = "sk-test-stub-key"
"""The API key the handlers send to the stub (tests assert it never shows up in errors or logs)."""

_STUB_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY")


@pytest.fixture(scope="session")
def openai_stub() -> Iterator[OpenAIStub]:
    """One stub server for the whole run; tests script it through directives in their own messages."""
    with OpenAIStub() as stub:
        yield stub


@pytest.fixture
def stub_env(openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    """OPENAI_BASE_URL/OPENAI_API_KEY point at the stub, settings re-read; restored afterwards."""
    from worker.config import reset_settings

    saved = {key: os.environ.get(key) for key in _STUB_ENV}
    os.environ["OPENAI_BASE_URL"] = openai_stub.base_url
    os.environ["OPENAI_API_KEY"] = STUB_API_KEY
    reset_settings()
    openai_stub.clear()
    try:
        yield openai_stub
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_settings()

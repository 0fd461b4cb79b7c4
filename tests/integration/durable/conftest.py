"""Durable steps (issue 28): turns resumed from their journal, run in this process against the real
Postgres and Redis and the model stub over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.effects import effect_tools


@pytest.fixture(autouse=True)
def _effects() -> Iterator[None]:
    """The side-effect tools (`tests.support.effects`) are registered for each test."""
    with effect_tools():
        yield


@pytest.fixture(autouse=True)
def _drop_sent_messages(drop_sent_messages: None) -> None:
    """No worker consumes what these tests send (tests.support.fixtures.drop_sent_messages)."""

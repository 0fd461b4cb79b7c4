"""The in-process runtime tests run deliveries without a worker; what they send is not for later tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _drop_sent_messages(drop_sent_messages: None) -> None:
    """No worker consumes what these tests send (tests.support.fixtures.drop_sent_messages)."""

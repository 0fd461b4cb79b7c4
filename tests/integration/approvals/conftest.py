"""Human approval of tool calls (issue 29): turns paused and resumed, run in this process against the
real Postgres and Redis and the model stub over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from handlers.tools import Tool, register_tool, unregister_tool
from tests.support.effects import PARAMETERS, append_line, effect_tools

APPROVED = "effect_approved"
"""A side-effect tool (`tests.support.effects`) that asks for a person's approval of every call."""


@pytest.fixture(autouse=True)
def _effects() -> Iterator[None]:
    """The side-effect tools are registered for each test, `effect_approved` among them."""
    with effect_tools():
        register_tool(
            Tool(
                name=APPROVED,
                description="Append a line to a file (a person approves each call).",
                parameters={**PARAMETERS, "additionalProperties": False},
                func=append_line,
                approval=True,
            )
        )
        try:
            yield
        finally:
            unregister_tool(APPROVED)


@pytest.fixture(autouse=True)
def _drop_sent_messages(drop_sent_messages: None) -> None:
    """No worker consumes what these tests send (tests.support.fixtures.drop_sent_messages)."""

"""Sessions in the test database and environment overrides for handler integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from handlers.base import SessionInfo


@pytest.fixture
def make_session(chatq_env: dict[str, str]) -> Callable[..., SessionInfo]:
    """Create a ChatSession row and return its detached view, as the worker hands it to a handler."""
    from models.db import session_scope
    from models.tables import ChatSession

    def create(
        framework: str = "langgraph",
        model: str = "gpt-4o-mini",
        system_prompt: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        row = ChatSession(
            id=uuid.uuid4(),
            agent_framework=framework,
            model=model,
            system_prompt=system_prompt,
            metadata_=metadata or {},
        )
        with session_scope() as db:
            db.add(row)
        return SessionInfo(
            id=row.id,
            agent_framework=framework,
            model=model,
            system_prompt=system_prompt,
            metadata_=metadata or {},
        )

    return create

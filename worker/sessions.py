"""Changing a session after it was created: `update_session` (system prompt, model, metadata, knowledge bases, webhook).

A change applies from the session's next claimed turn on: a turn claims the session row as it is
when it starts, so a running turn finishes on what it started with.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete

from chatq.settings import Settings
from models.db import session_scope
from models.knowledge import attach_knowledge_bases
from models.tables import SessionKnowledgeBase
from worker.errors import InvalidTurn
from worker.history import get_session, scoped_session
from worker.payload import (
    check_text,
    parse_uuid,
    validate_approval,
    validate_metadata,
    validate_model,
    validate_system_prompt,
)
from worker.webhook_urls import validate_webhook

__all__ = ["KEEP", "Keep", "update_session"]

log = logging.getLogger(__name__)


class Keep(enum.Enum):
    """The type of `KEEP`."""

    KEEP = "keep"
    """Leave the field as it is."""


KEEP = Keep.KEEP
"""The default of each `update_session` field: unchanged (None means "clear" for some fields)."""

_FIELD_NAMES = {"metadata_": "metadata", "webhook_url": "webhook"}
"""Column attributes by the names `update_session` takes (for its log line)."""


def update_session(
    session_id: uuid.UUID | str,
    *,
    system_prompt: str | Keep | None = KEEP,
    model: str | Keep | None = KEEP,
    metadata: Mapping[str, Any] | Keep | None = KEEP,
    knowledge_bases: Sequence[str] | Keep = KEEP,
    webhook: str | Keep | None = KEEP,
    approval: str | Sequence[str] | Keep = KEEP,
    tenant: str | None = None,
    settings: Settings,
) -> dict[str, Any]:
    """Change what is given and return the session as `get_session` does.

    `system_prompt=None` removes the session's own instructions; `model=None` makes its turns run
    on the worker's default model; `metadata` replaces the metadata (None: empty);
    `knowledge_bases` (names) replaces the attached set; `webhook` (an http(s) URL, checked as
    `create_session` checks it) is where its turns are POSTed from now on, None: nowhere; `approval`
    (none, paid, all or tool names) sets the metadata's `approval` (after `metadata`, if both).
    SessionNotFound as for `get_session`, KnowledgeBaseNotFound for an unknown name, WebhookRefused
    (then nothing changes). `settings` bound the system prompt and the webhook's address (the
    producer's `update_session` reads them).
    """
    session_uuid = parse_uuid(str(session_id), "session_id")
    changes: dict[str, Any] = {}
    if not isinstance(system_prompt, Keep):
        changes["system_prompt"] = validate_system_prompt(system_prompt, settings)
    if not isinstance(model, Keep):
        changes["model"] = validate_model(model)
    if not isinstance(metadata, Keep):
        changes["metadata_"] = validate_metadata(metadata)
    if not isinstance(webhook, Keep):
        changes["webhook_url"] = validate_webhook(webhook, allow_private=settings.webhook_allow_private)
    approval_value = None if isinstance(approval, Keep) else validate_approval(approval)
    names: list[str] | None = None
    if not isinstance(knowledge_bases, Keep):
        if isinstance(knowledge_bases, str) or not all(isinstance(name, str) for name in knowledge_bases):
            raise InvalidTurn("knowledge_bases must be a list of knowledge base names")
        names = [check_text(name, "knowledge base name") for name in knowledge_bases]
    with session_scope() as db:
        row = scoped_session(db, session_uuid, tenant, lock=True)
        if approval_value is not None:
            changes["metadata_"] = {**changes.get("metadata_", row.metadata_ or {}), "approval": approval_value}
        for name, value in changes.items():
            setattr(row, name, value)
        if names is not None:
            db.execute(delete(SessionKnowledgeBase).where(SessionKnowledgeBase.session_id == session_uuid))
            if names:
                attach_knowledge_bases(session_uuid, names, db=db)
    fields = sorted(changes) + (["knowledge_bases"] if names is not None else [])
    log.info("session %s updated (%s)", session_uuid, ", ".join(_FIELD_NAMES.get(n, n) for n in fields) or "nothing")
    return get_session(session_uuid, tenant=tenant)

"""Knowledge-base names and owners: what a name may be, which tenant's knowledge bases a caller may
name, and the one answer for a name it may not (`KnowledgeBaseNotFound`, as for no such name).

A knowledge base belongs to a tenant (`KnowledgeBase.tenant`; NULL: the operator's, for sessions
without a tenant). A session names only its own tenant's (`same_tenant`); the operator's tools
(`chatq kb`) see every tenant's (`EVERY_TENANT`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from models.errors import KnowledgeBaseError, KnowledgeBaseNotFound
from models.tables import KnowledgeBase

__all__ = ["EVERY_TENANT", "MAX_NAME_CHARS", "EveryTenant", "ids_by_name", "normalize_name", "same_tenant"]

MAX_NAME_CHARS = 100


class EveryTenant(enum.Enum):
    """The type of `EVERY_TENANT`."""

    EVERY = "every"
    """Every knowledge base, whoever owns it."""


EVERY_TENANT = EveryTenant.EVERY
"""The operator's view (`chatq kb`, the admin token): every tenant's knowledge bases."""


def normalize_name(name: str) -> str:
    """A knowledge base name as stored: one line, trimmed, 1-100 characters."""
    if not isinstance(name, str):
        raise KnowledgeBaseError("a knowledge base name must be text")
    clean = " ".join(name.split())
    if not clean:
        raise KnowledgeBaseError("a knowledge base name cannot be empty")
    if len(clean) > MAX_NAME_CHARS:
        raise KnowledgeBaseError(f"a knowledge base name is at most {MAX_NAME_CHARS} characters")
    return clean


def same_tenant(tenant: Any) -> ColumnElement[bool]:
    """Knowledge bases of `tenant` (a name, None, or a column such as `ChatSession.tenant`): NULL matches NULL."""
    return KnowledgeBase.tenant.is_not_distinct_from(tenant)


def ids_by_name(
    db: Session, names: Iterable[str], *, tenant: str | EveryTenant | None = EVERY_TENANT
) -> dict[str, int]:
    """Ids of the named knowledge bases of `tenant`; KnowledgeBaseNotFound naming every unknown one.

    Another tenant's knowledge base is unknown, with the very words of one that does not exist.
    """
    wanted = list(dict.fromkeys(normalize_name(n) for n in names))
    if not wanted:
        return {}
    query = select(KnowledgeBase.name, KnowledgeBase.id).where(KnowledgeBase.name.in_(wanted))
    if not isinstance(tenant, EveryTenant):
        query = query.where(same_tenant(tenant))
    found = {row.name: int(row.id) for row in db.execute(query).all()}
    missing = [n for n in wanted if n not in found]
    if missing:
        noun = "knowledge base" if len(missing) == 1 else "knowledge bases"
        create = "chatq kb create NAME" + (f" --tenant {tenant}" if isinstance(tenant, str) else "")
        raise KnowledgeBaseNotFound(f"unknown {noun}: {', '.join(missing)} (create one with `{create}`)")
    return {name: found[name] for name in wanted}

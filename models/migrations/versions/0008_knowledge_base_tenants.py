"""knowledge bases belong to a tenant

`knowledge_bases.tenant`: the tenant that owns the knowledge base (`chatq kb create --tenant`);
NULL for the operator's own, used by sessions without a tenant. A session reads only the
knowledge bases of its own tenant (NULL with NULL), so the knowledge bases that exist before this
revision (all NULL) keep serving sessions created without a tenant token; a tenant's sessions stop
reading them until the operator gives them to the tenant (`chatq kb tenant KB TENANT`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("knowledge_bases", sa.Column("tenant", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("knowledge_bases", "tenant")

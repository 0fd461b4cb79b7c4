"""sessions: tenants, last activity, list indexes; usage kept after deletion; deleted-session digests

`chat_sessions.tenant` is the tenant whose scoped gateway token created the session (NULL: created
without one). `chat_sessions.last_active_at` is when its newest turn was submitted (retention purges
sessions idle longer than CHATQ_RETENTION_DAYS), backfilled from the turns. Indexes serve the keyset
pagination of session lists (newest first, per tenant), the metadata filter and the retention scan.

`usage_rollups` keeps, without content or ids, what billing needs of deleted sessions: token and
paid-tool totals per day, tenant, model and tool. `deleted_sessions` holds the SHA-256 digest of
each deleted session id for a while, so a task message still in Redis does not create it again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chat_sessions", sa.Column("tenant", sa.String(length=64), nullable=True))
    op.add_column(
        "chat_sessions",
        sa.Column("last_active_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.execute(
        """
        UPDATE chat_sessions s
        SET last_active_at = GREATEST(s.created_at, COALESCE(
            (SELECT max(t.created_at) FROM turns t WHERE t.session_id = s.id), s.created_at))
        """
    )
    op.create_index("ix_chat_sessions_created", "chat_sessions", ["created_at", "id"])
    op.create_index("ix_chat_sessions_tenant_created", "chat_sessions", ["tenant", "created_at", "id"])
    op.create_index("ix_chat_sessions_last_active", "chat_sessions", ["last_active_at", "id"])
    op.create_index(
        "ix_chat_sessions_metadata",
        "chat_sessions",
        ["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )
    op.create_table(
        "usage_rollups",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("tool_name", sa.String(length=64), nullable=True),
        sa.Column("turns", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("total_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("tool_calls", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("tool_units", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("tool_cost", sa.Numeric(20, 10), server_default=sa.text("0"), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_rollups")),
    )
    op.create_index("ix_usage_rollups_day", "usage_rollups", ["day"])
    op.create_table(
        "deleted_sessions",
        sa.Column("digest", postgresql.BYTEA(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_deleted_sessions")),
    )
    op.create_index("ix_deleted_sessions_deleted_at", "deleted_sessions", ["deleted_at"])


def downgrade() -> None:
    op.drop_index("ix_deleted_sessions_deleted_at", table_name="deleted_sessions")
    op.drop_table("deleted_sessions")
    op.drop_index("ix_usage_rollups_day", table_name="usage_rollups")
    op.drop_table("usage_rollups")
    op.drop_index("ix_chat_sessions_metadata", table_name="chat_sessions", postgresql_using="gin")
    op.drop_index("ix_chat_sessions_last_active", table_name="chat_sessions")
    op.drop_index("ix_chat_sessions_tenant_created", table_name="chat_sessions")
    op.drop_index("ix_chat_sessions_created", table_name="chat_sessions")
    op.drop_column("chat_sessions", "last_active_at")
    op.drop_column("chat_sessions", "tenant")

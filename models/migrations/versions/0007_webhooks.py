"""webhooks: a URL per session or turn, and one delivery per ended turn

`chat_sessions.webhook_url` and `turns.webhook_url`: where a turn is POSTed when it ends (the
turn's own, else its session's). `webhook_deliveries`: one row per ended turn with a webhook, its
id sent as `X-Chatq-Delivery` on every attempt, the body fixed at the first attempt, and the
attempts, last status code and last error shown by `chatq show` and `GET /turns/{id}`.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chat_sessions", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.add_column("turns", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "delivered",
                "failed",
                name="delivery_status",
                native_enum=False,
                length=16,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name="fk_webhook_deliveries_turn_id_turns", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        sa.UniqueConstraint("turn_id", name="uq_webhook_deliveries_turn_id"),
    )
    op.create_index(
        "ix_webhook_deliveries_pending",
        "webhook_deliveries",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_webhook_deliveries_pending", table_name="webhook_deliveries", postgresql_where=sa.text("status = 'pending'")
    )
    op.drop_table("webhook_deliveries")
    op.drop_column("turns", "webhook_url")
    op.drop_column("chat_sessions", "webhook_url")

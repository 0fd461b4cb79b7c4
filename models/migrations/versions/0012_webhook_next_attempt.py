"""webhook recovery: when each pending delivery's next attempt is due, so a lost task message is re-sent

A delivery's task message lives in Redis only. `webhook_deliveries.next_attempt_at` says when the
next attempt of a `pending` delivery is due (its creation, then each failed attempt's back-off; an
attempt under way holds it ahead by the attempt's time limit): the sweep sends again the deliveries
due for longer than CHATQ_REQUEUE_GRACE, whose message was lost (docs/contract.md, "Webhooks").
The partial index of pending deliveries is on it instead of `created_at`. Rows pending now are
due now: the sweep sends them again once the grace has passed, and a copy whose message was not
lost finds its attempt already taken and does nothing. `resends` counts the sweep's re-sends of a
row: each waits twice as long as the one before (up to 20 graces), so a queue no worker takes from
for hours gathers a few copies per row, not one per grace.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-23 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_deliveries",
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.add_column(
        "webhook_deliveries",
        sa.Column("resends", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.drop_index(
        "ix_webhook_deliveries_pending", table_name="webhook_deliveries", postgresql_where=sa.text("status = 'pending'")
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_webhook_deliveries_due", table_name="webhook_deliveries", postgresql_where=sa.text("status = 'pending'")
    )
    op.create_index(
        "ix_webhook_deliveries_pending",
        "webhook_deliveries",
        ["created_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_column("webhook_deliveries", "resends")
    op.drop_column("webhook_deliveries", "next_attempt_at")

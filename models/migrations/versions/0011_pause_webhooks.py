"""pause webhooks: a turn's webhook deliveries are one per pause for approval and one when it ends

`webhook_deliveries` was one row per ended turn (unique `turn_id`). A turn that pauses for a
person's decision (`awaiting_approval`, docs/contract.md "Approvals") now gets a delivery at each
pause too, recorded in the transaction that pauses it. Each row says why it is sent (`event`:
`ended` or `awaiting_approval`) and its place among the turn's deliveries (`ordinal`: 1, 2, ...);
`(turn_id, ordinal)` is unique, and so is a turn's `ended` delivery (a partial unique index).
Existing rows are `ended` deliveries, each its turn's first.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-22 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_deliveries",
        sa.Column("event", sa.String(length=32), server_default=sa.text("'ended'"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_webhook_deliveries_delivery_event"),
        "webhook_deliveries",
        "event IN ('ended', 'awaiting_approval')",
    )
    op.add_column("webhook_deliveries", sa.Column("ordinal", sa.Integer(), server_default=sa.text("1"), nullable=False))
    op.drop_constraint("uq_webhook_deliveries_turn_id", "webhook_deliveries", type_="unique")
    op.create_unique_constraint("uq_webhook_deliveries_turn_ordinal", "webhook_deliveries", ["turn_id", "ordinal"])
    op.create_index(
        "ix_webhook_deliveries_turn_ended",
        "webhook_deliveries",
        ["turn_id"],
        unique=True,
        postgresql_where=sa.text("event = 'ended'"),
    )


def downgrade() -> None:
    # An older chatq knows only the delivery of an ended turn.
    op.execute("DELETE FROM webhook_deliveries WHERE event <> 'ended'")
    op.drop_index(
        "ix_webhook_deliveries_turn_ended", table_name="webhook_deliveries", postgresql_where=sa.text("event = 'ended'")
    )
    op.drop_constraint("uq_webhook_deliveries_turn_ordinal", "webhook_deliveries", type_="unique")
    op.create_unique_constraint("uq_webhook_deliveries_turn_id", "webhook_deliveries", ["turn_id"])
    op.drop_column("webhook_deliveries", "ordinal")
    op.drop_constraint(op.f("ck_webhook_deliveries_delivery_event"), "webhook_deliveries", type_="check")
    op.drop_column("webhook_deliveries", "event")

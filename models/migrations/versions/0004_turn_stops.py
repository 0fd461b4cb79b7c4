"""what is known of the workers that stopped while running a turn

`turns.stopped_worker` and `turns.stopped_at`: the last worker that stopped (its lease ran out
unrenewed) while running the turn, and that lease's expiry, kept after the turn moves on so that
the turns that stopped with it still find it. `turns.lone_crashes` and `turns.crash_hosts`: of the
turn's crashed deliveries since its last clean end, how many it was the only turn running on its
worker, and the hosts of those workers. A crash counts towards CHATQ_MAX_DELIVERIES only when the
turn is its likely cause (`worker.store.turns.poison_reason`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("stopped_worker", sa.String(length=255), nullable=True))
    op.add_column("turns", sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("turns", sa.Column("lone_crashes", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column(
        "turns",
        sa.Column("crash_hosts", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'::text[]"), nullable=False),
    )
    op.create_index(
        "ix_turns_stopped",
        "turns",
        ["stopped_worker", "stopped_at"],
        unique=False,
        postgresql_where=sa.text("stopped_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_stopped", table_name="turns", postgresql_where=sa.text("stopped_at IS NOT NULL"))
    op.drop_column("turns", "crash_hosts")
    op.drop_column("turns", "lone_crashes")
    op.drop_column("turns", "stopped_at")
    op.drop_column("turns", "stopped_worker")

"""turn steps: the journal a resumed attempt continues from

`turn_steps`: one row per finished step of a running turn (an assistant message that called tools
with its usage, a tool call started, a tool call's result), keyed by (turn, seq), written under the
turn's lease. A later attempt (takeover, hand-back, retry, a wait for the model service) reads them
and continues after the last, instead of starting over (docs/contract.md, "Durable steps"). Rows go
with their turn (ON DELETE CASCADE), so session deletion and retention remove them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "turn_steps",
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "model",
                "tool_started",
                "tool_result",
                name="step_kind",
                native_enum=False,
                length=16,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(length=255), nullable=True),
        sa.Column("tool_name", sa.String(length=64), nullable=True),
        sa.Column("message", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("usage", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name="fk_turn_steps_turn_id_turns", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("turn_id", "seq", name="pk_turn_steps"),
    )


def downgrade() -> None:
    op.drop_table("turn_steps")

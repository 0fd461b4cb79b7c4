"""delayed turns: the status `delayed`, `turns.run_at`, `turns.pending_input`, a nullable position

A turn submitted with `run_at`/`delay` is stored at once as `delayed` (docs/contract.md, "Turns in
order"): no position (NULL: it holds no place in its session's order until it is due), its user
message kept in `pending_input` until then, `run_at` its due time. Every worker's due step finds the
due ones on the partial index `ix_turns_run_at` and moves each to `queued` with its session's next
position, storing its user message. The status is text with a check constraint (not an enum type),
so the new value is a new constraint; the partial index of unfinished turns does not list it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = ("queued", "running", "awaiting_approval", "succeeded", "failed", "cancelled")


def _in(values: Sequence[str]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_turns_turn_status"), "turns", type_="check")
    op.create_check_constraint(op.f("ck_turns_turn_status"), "turns", f"status IN ({_in((*_STATUSES, 'delayed'))})")
    op.add_column("turns", sa.Column("run_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("turns", sa.Column("pending_input", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.alter_column("turns", "position", existing_type=sa.Integer(), nullable=True)
    op.create_index("ix_turns_run_at", "turns", ["run_at"], postgresql_where=sa.text("status = 'delayed'"))


def downgrade() -> None:
    # Delayed turns cannot be kept by an older chatq: they end cancelled, and get a position each
    # (after their session's others) so the column can be NOT NULL again.
    op.execute(
        """
        WITH placed AS (
            SELECT t.id, s.next_turn_position
                   + row_number() OVER (PARTITION BY t.session_id ORDER BY t.run_at, t.id) - 1 AS position
            FROM turns t JOIN chat_sessions s ON s.id = t.session_id
            WHERE t.status = 'delayed'
        ),
        bumped AS (
            UPDATE chat_sessions s SET next_turn_position = s.next_turn_position + c.n
            FROM (SELECT session_id, count(*) AS n FROM turns WHERE status = 'delayed' GROUP BY session_id) c
            WHERE s.id = c.session_id
        )
        UPDATE turns t SET status = 'cancelled', finished_at = now(), position = placed.position
        FROM placed WHERE t.id = placed.id
        """
    )
    op.drop_index("ix_turns_run_at", table_name="turns", postgresql_where=sa.text("status = 'delayed'"))
    op.alter_column("turns", "position", existing_type=sa.Integer(), nullable=False)
    op.drop_column("turns", "pending_input")
    op.drop_column("turns", "run_at")
    op.drop_constraint(op.f("ck_turns_turn_status"), "turns", type_="check")
    op.create_check_constraint(op.f("ck_turns_turn_status"), "turns", f"status IN ({_in(_STATUSES)})")

"""tool approvals: the paused status `awaiting_approval`, its deadline, and the journal's approval steps

A turn whose model called a tool that needs a person's approval pauses (`awaiting_approval`): it
holds its session's place like a running turn (the partial index of unfinished turns lists it) and
waits until its decisions are made or `turns.approval_until` passes (the sweep denies then). The
journal (`turn_steps`) gains the kinds `approval_pending` and `approval_decided`
(docs/contract.md, "Approvals"). The status column widens to 32 characters for the new name.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-20 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
_KINDS = ("model", "tool_started", "tool_result")


def _in(values: Sequence[str]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def upgrade() -> None:
    op.alter_column("turns", "status", type_=sa.String(length=32), existing_type=sa.String(length=16))
    op.drop_constraint(op.f("ck_turns_turn_status"), "turns", type_="check")
    op.create_check_constraint(
        op.f("ck_turns_turn_status"),
        "turns",
        f"status IN ({_in((*_STATUSES[:2], 'awaiting_approval', *_STATUSES[2:]))})",
    )
    op.drop_constraint(op.f("ck_turn_steps_step_kind"), "turn_steps", type_="check")
    op.create_check_constraint(
        op.f("ck_turn_steps_step_kind"),
        "turn_steps",
        f"kind IN ({_in((*_KINDS, 'approval_pending', 'approval_decided'))})",
    )
    op.add_column("turns", sa.Column("approval_until", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_turns_active_by_session", table_name="turns")
    op.create_index(
        "ix_turns_active_by_session",
        "turns",
        ["session_id", "position"],
        postgresql_where=sa.text("status IN ('queued', 'running', 'awaiting_approval')"),
    )
    op.create_index(
        "ix_turns_approval_until",
        "turns",
        ["approval_until"],
        postgresql_where=sa.text("status = 'awaiting_approval'"),
    )


def downgrade() -> None:
    # Paused turns cannot be kept by an older chatq: they end cancelled.
    op.execute("UPDATE turns SET status = 'cancelled', finished_at = now() WHERE status = 'awaiting_approval'")
    op.execute("DELETE FROM turn_steps WHERE kind IN ('approval_pending', 'approval_decided')")
    op.drop_index("ix_turns_approval_until", table_name="turns")
    op.drop_index("ix_turns_active_by_session", table_name="turns")
    op.create_index(
        "ix_turns_active_by_session",
        "turns",
        ["session_id", "position"],
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )
    op.drop_column("turns", "approval_until")
    op.drop_constraint(op.f("ck_turn_steps_step_kind"), "turn_steps", type_="check")
    op.create_check_constraint(op.f("ck_turn_steps_step_kind"), "turn_steps", f"kind IN ({_in(_KINDS)})")
    op.drop_constraint(op.f("ck_turns_turn_status"), "turns", type_="check")
    op.create_check_constraint(op.f("ck_turns_turn_status"), "turns", f"status IN ({_in(_STATUSES)})")
    op.alter_column("turns", "status", type_=sa.String(length=16), existing_type=sa.String(length=32))

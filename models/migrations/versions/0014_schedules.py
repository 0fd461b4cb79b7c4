"""schedules: turns submitted on a cron expression or every N seconds, fired by the workers

`schedules` holds each schedule (its session, or a template for a new session per run; its
cron or period in a zone; its overlap and misfire policies; its bounds and its progress:
`next_run_at`, `runs`, `skipped`, `last_run_at`). Deleting a session deletes its schedules
(ON DELETE CASCADE). `turns.schedule_id` names the schedule whose tick created a turn, so a
schedule's last runs can be listed; deleting the schedule keeps its turns (ON DELETE SET NULL).
See docs/contract.md, "Schedules".

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("session_id", sa.Uuid(), nullable=True),
        sa.Column("session_template", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("every_seconds", sa.Numeric(), nullable=True),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column("overlap", sa.String(length=16), server_default="skip", nullable=False),
        sa.Column("misfire", sa.String(length=16), server_default="once", nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_runs", sa.Integer(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("runs", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name=op.f("fk_schedules_session_id_chat_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
    )
    op.create_index("ix_schedules_due", "schedules", ["next_run_at"], postgresql_where=sa.text("enabled"))
    op.create_index("ix_schedules_tenant_created", "schedules", ["tenant", "created_at", "id"])
    op.create_index("ix_schedules_session_id", "schedules", ["session_id"])
    op.add_column("turns", sa.Column("schedule_id", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        op.f("fk_turns_schedule_id_schedules"), "turns", "schedules", ["schedule_id"], ["id"], ondelete="SET NULL"
    )
    op.create_index(
        "ix_turns_schedule",
        "turns",
        ["schedule_id", "created_at"],
        postgresql_where=sa.text("schedule_id IS NOT NULL"),
    )
    # overlap=skip asks per tick whether the previous run is unfinished: only unfinished runs indexed.
    op.create_index(
        "ix_turns_schedule_active",
        "turns",
        ["schedule_id"],
        postgresql_where=sa.text("schedule_id IS NOT NULL AND status IN ('queued', 'running', 'awaiting_approval')"),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_schedule_active", table_name="turns")
    op.drop_index("ix_turns_schedule", table_name="turns", postgresql_where=sa.text("schedule_id IS NOT NULL"))
    op.drop_constraint(op.f("fk_turns_schedule_id_schedules"), "turns", type_="foreignkey")
    op.drop_column("turns", "schedule_id")
    op.drop_index("ix_schedules_session_id", table_name="schedules")
    op.drop_index("ix_schedules_tenant_created", table_name="schedules")
    op.drop_index("ix_schedules_due", table_name="schedules", postgresql_where=sa.text("enabled"))
    op.drop_table("schedules")

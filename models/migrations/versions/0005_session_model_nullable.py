"""chat_sessions.model may be NULL: the worker's default model

A session created without a model used to store the default of whoever created it (a terminal, a
batch run, the gateway), so one created where OPENAI_API_KEY was unset ran on `echo` even though
the worker had a key. NULL now means "the default model of the worker that runs each turn"
(`Settings.session_model`). Existing rows keep the model they stored.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("chat_sessions", "model", existing_type=sa.String(length=200), nullable=True)


def downgrade() -> None:
    # The old schema needs a name: the default model the caller hands in (`models.migrate`), else
    # that of the environment running the downgrade (env.py); run it with the workers' environment
    # so their sessions keep the model they ran on.
    model = context.config.attributes["default_model"]
    op.execute(sa.text("UPDATE chat_sessions SET model = :model WHERE model IS NULL").bindparams(model=model))
    op.alter_column("chat_sessions", "model", existing_type=sa.String(length=200), nullable=False)

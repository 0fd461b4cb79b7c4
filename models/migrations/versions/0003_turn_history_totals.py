"""running history totals on turns

`turns.history_turns` and `turns.history_messages`: how many succeeded turns, and how many messages
in them, the session has up to and including a succeeded turn. `handlers.history` reads what it
leaves out of a long session from one row instead of counting the session's messages. Existing
succeeded turns are filled in here.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 05:15:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("history_turns", sa.Integer(), nullable=True))
    op.add_column("turns", sa.Column("history_messages", sa.BigInteger(), nullable=True))
    op.execute(
        """
        UPDATE turns t
        SET history_turns = totals.turns, history_messages = totals.messages
        FROM (
            SELECT s.id,
                   count(*) OVER w AS turns,
                   sum(coalesce(m.messages, 0)) OVER w AS messages
            FROM turns s
            LEFT JOIN (SELECT turn_id, count(*) AS messages FROM chat_messages GROUP BY turn_id) m ON m.turn_id = s.id
            WHERE s.status = 'succeeded'
            WINDOW w AS (PARTITION BY s.session_id ORDER BY s.position)
        ) totals
        WHERE t.id = totals.id
        """
    )


def downgrade() -> None:
    op.drop_column("turns", "history_messages")
    op.drop_column("turns", "history_turns")

"""knowledge bases and paid tool calls

Knowledge bases, documents (many to many), chunks with a generated tsvector column under a GIN
index, knowledge bases attached to sessions, the record of paid tool calls, and the citations of
an assistant message.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 23:03:58.514939
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("title", sa.String(length=500), nullable=False),
        sa.Column("source_path", sa.String(length=2048), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_documents")),
        sa.UniqueConstraint("source_path", name=op.f("uq_documents_source_path")),
    )
    op.create_table(
        "knowledge_bases",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knowledge_bases")),
        sa.UniqueConstraint("name", name=op.f("uq_knowledge_bases_name")),
    )
    op.create_table(
        "document_chunks",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("document_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "search",
            postgresql.TSVECTOR(),
            sa.Computed("to_tsvector('english'::regconfig, content)", persisted=True),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["document_id"], ["documents.id"], name=op.f("fk_document_chunks_document_id_documents"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_document_chunks")),
        sa.UniqueConstraint("document_id", "position", name="uq_document_chunks_document_position"),
    )
    op.create_index("ix_document_chunks_search", "document_chunks", ["search"], unique=False, postgresql_using="gin")
    op.create_table(
        "knowledge_base_documents",
        sa.Column("knowledge_base_id", sa.BigInteger(), nullable=False),
        sa.Column("document_id", sa.BigInteger(), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["documents.id"],
            name=op.f("fk_knowledge_base_documents_document_id_documents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["knowledge_base_id"],
            ["knowledge_bases.id"],
            name=op.f("fk_knowledge_base_documents_knowledge_base_id_knowledge_bases"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("knowledge_base_id", "document_id", name="pk_knowledge_base_documents"),
    )
    op.create_index(
        "ix_knowledge_base_documents_document_id", "knowledge_base_documents", ["document_id"], unique=False
    )
    op.create_table(
        "session_knowledge_bases",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("knowledge_base_id", sa.BigInteger(), nullable=False),
        sa.Column("attached_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["knowledge_base_id"],
            ["knowledge_bases.id"],
            name=op.f("fk_session_knowledge_bases_knowledge_base_id_knowledge_bases"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name=op.f("fk_session_knowledge_bases_session_id_chat_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "knowledge_base_id", name="pk_session_knowledge_bases"),
    )
    op.create_index(
        "ix_session_knowledge_bases_knowledge_base_id", "session_knowledge_bases", ["knowledge_base_id"], unique=False
    )
    op.create_table(
        "paid_tool_calls",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("invocation_id", sa.Uuid(), nullable=False),
        sa.Column("tool_call_id", sa.String(length=255), nullable=False),
        sa.Column("tool_name", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=True),
        sa.Column("turn_id", sa.Uuid(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("units", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("unit_price", sa.Numeric(precision=20, scale=10), server_default=sa.text("0"), nullable=False),
        sa.Column("cost", sa.Numeric(precision=20, scale=10), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name=op.f("fk_paid_tool_calls_session_id_chat_sessions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_paid_tool_calls_turn_id_turns"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_paid_tool_calls")),
        sa.UniqueConstraint("invocation_id", "tool_call_id", name="uq_paid_tool_calls_invocation_call"),
    )
    op.create_index("ix_paid_tool_calls_session_id", "paid_tool_calls", ["session_id"], unique=False)
    op.create_index("ix_paid_tool_calls_turn_id", "paid_tool_calls", ["turn_id"], unique=False)
    op.add_column("chat_messages", sa.Column("citations", postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("chat_messages", "citations")
    op.drop_index("ix_paid_tool_calls_turn_id", table_name="paid_tool_calls")
    op.drop_index("ix_paid_tool_calls_session_id", table_name="paid_tool_calls")
    op.drop_table("paid_tool_calls")
    op.drop_index("ix_session_knowledge_bases_knowledge_base_id", table_name="session_knowledge_bases")
    op.drop_table("session_knowledge_bases")
    op.drop_index("ix_knowledge_base_documents_document_id", table_name="knowledge_base_documents")
    op.drop_table("knowledge_base_documents")
    op.drop_index("ix_document_chunks_search", table_name="document_chunks", postgresql_using="gin")
    op.drop_table("document_chunks")
    op.drop_table("knowledge_bases")
    op.drop_table("documents")

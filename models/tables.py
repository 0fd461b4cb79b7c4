"""SQLAlchemy 2 typed models of chatq's three tables (SPEC.md, "Data")."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names so Alembic migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

MESSAGE_POSITION_STRIDE = 1000
"""A turn at position p stores its messages at positions p*STRIDE + 0 (the user's), +1, +2, ...

Turns of one session can be queued before earlier ones have replied; the stride keeps every turn's
messages together and in order on the (session_id, position) index without renumbering anything."""


class TurnStatus(enum.StrEnum):
    """Where a turn is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True once the turn can change no more."""
        return self in (TurnStatus.SUCCEEDED, TurnStatus.FAILED, TurnStatus.CANCELLED)


ACTIVE_STATUSES = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value)


class Base(DeclarativeBase):
    """Declarative base of chatq's models."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class ChatSession(Base):
    """A conversation: its agent framework, model, instructions and metadata."""

    __tablename__ = "chat_sessions"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    agent_framework: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, default=dict, server_default=text("'{}'::jsonb")
    )
    next_turn_position: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Position the next turn gets; bumped under the row lock so concurrent submits never collide."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Turn(Base):
    """One user message and the agent's work on it; its id is the Celery task id."""

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("session_id", "position", name="uq_turns_session_position"),
        # The worker's hot queries: "what is ahead of this turn in its session" and the sweeper's
        # scan, both only over unfinished turns, which stay few however long the history grows.
        Index(
            "ix_turns_active_by_session",
            "session_id",
            "position",
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index("ix_turns_created_at", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    status: Mapped[TurnStatus] = mapped_column(
        Enum(
            TurnStatus,
            name="turn_status",
            native_enum=False,
            length=16,
            values_callable=lambda e: [m.value for m in e],
            create_constraint=True,
        ),
        default=TurnStatus.QUEUED,
    )
    queue: Mapped[str] = mapped_column(String(64), default="chatq", server_default="chatq")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    error: Mapped[str | None] = mapped_column(Text)
    reply_to: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    total_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker: Mapped[str | None] = mapped_column(String(255))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ChatMessage(Base):
    """A stored message of a session: the user's, the assistant's or a tool's."""

    __tablename__ = "chat_messages"
    __table_args__ = (
        # History is read newest-first by position; this unique index serves that scan.
        UniqueConstraint("session_id", "position", name="uq_chat_messages_session_position"),
        Index("ix_chat_messages_turn_id", "turn_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    session_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    turn_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(BigInteger)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text, default="")
    tool_calls: Mapped[list[Any] | None] = mapped_column(JSONB)
    tool_call_id: Mapped[str | None] = mapped_column(String(255))
    images: Mapped[list[Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

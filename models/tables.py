"""SQLAlchemy 2 typed models of chatq's tables.

The three tables of docs/contract.md ("Data"), then knowledge bases (documents, chunks searchable with
Postgres full-text search, attachments to sessions), the record of paid tool calls and webhook deliveries.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Computed,
    Date,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
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
    AWAITING_APPROVAL = "awaiting_approval"
    """Paused until a person decides on its tool calls (`handlers.approvals`): it holds its session's
    place like a running turn, but no worker, lease or connection."""
    DELAYED = "delayed"
    """Stored to run from `run_at` on (`submit_turn(run_at=..., delay=...)`): until then it has no
    position, no user message (its input waits in `pending_input`) and no place in its session's
    order, so the session's other turns run past it. When due, a worker's due step moves it to
    `queued` with the session's next position and stores its user message (`release_due_turns`).
    A cancel before then ends it `cancelled` with nothing else stored."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True once the turn can change no more."""
        return self in (TurnStatus.SUCCEEDED, TurnStatus.FAILED, TurnStatus.CANCELLED)


ACTIVE_STATUSES = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value, TurnStatus.AWAITING_APPROVAL.value)
"""The unfinished statuses: a turn in one of them holds its session's place (the partial indexes list them).
A `delayed` turn is unfinished too but holds no place until it is due, so it is not one of them."""


class Base(DeclarativeBase):
    """Declarative base of chatq's models."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class ChatSession(Base):
    """A conversation: its agent framework, model, instructions and metadata."""

    __tablename__ = "chat_sessions"
    __table_args__ = (
        # Keyset pagination of session lists, newest first (`worker.sessions`), overall and per tenant.
        Index("ix_chat_sessions_created", "created_at", "id"),
        Index("ix_chat_sessions_tenant_created", "tenant", "created_at", "id"),
        # The retention sweep's scan for idle sessions.
        Index("ix_chat_sessions_last_active", "last_active_at", "id"),
        # `metadata.KEY=VALUE` filters (JSONB containment).
        Index(
            "ix_chat_sessions_metadata",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    agent_framework: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    """The model its turns run on; NULL: the default model of the worker running each turn (its CHATQ_MODEL)."""
    system_prompt: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, default=dict, server_default=text("'{}'::jsonb")
    )
    next_turn_position: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Position the next turn gets; bumped under the row lock so concurrent submits never collide."""
    webhook_url: Mapped[str | None] = mapped_column(Text)
    """Where each of its turns is POSTed when it ends (a turn's own `webhook_url` takes its place)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    tenant: Mapped[str | None] = mapped_column(String(64))
    """The tenant that owns it and its turns (`chatq.tenants`' rule): its creating scoped gateway token's
    (CHATQ_API_TOKENS), or given by the producer API, the command line, a batch or a raw message; NULL:
    no tenant. Set at creation, never changed."""
    last_active_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """When its newest turn was submitted (or it was created); retention (CHATQ_RETENTION_DAYS) reads it."""


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
            postgresql_where=text("status IN ('queued', 'running', 'awaiting_approval')"),
        ),
        # The sweep's scan for paused turns whose approval deadline passed.
        Index(
            "ix_turns_approval_until",
            "approval_until",
            postgresql_where=text("status = 'awaiting_approval'"),
        ),
        # The due steps' scan for delayed turns whose time came (`worker.store.delayed`).
        Index("ix_turns_run_at", "run_at", postgresql_where=text("status = 'delayed'")),
        Index("ix_turns_created_at", "created_at"),
        # A schedule's last runs, and whether its previous run is still unfinished (overlap=skip).
        Index("ix_turns_schedule", "schedule_id", "created_at", postgresql_where=text("schedule_id IS NOT NULL")),
        # overlap=skip's question per tick, which must not scan a long-running schedule's history.
        Index(
            "ix_turns_schedule_active",
            "schedule_id",
            postgresql_where=text("schedule_id IS NOT NULL AND status IN ('queued', 'running', 'awaiting_approval')"),
        ),
        # Finding the turns that stopped with a crashed one (`worker.store.claims.record_stops`).
        Index(
            "ix_turns_stopped",
            "stopped_worker",
            "stopped_at",
            postgresql_where=text("stopped_at IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    position: Mapped[int | None] = mapped_column(Integer)
    """Its place in the session's order; NULL while `delayed` (it takes the next one when due)."""
    status: Mapped[TurnStatus] = mapped_column(
        Enum(
            TurnStatus,
            name="turn_status",
            native_enum=False,
            length=32,
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
    stopped_worker: Mapped[str | None] = mapped_column(String(255))
    """The last worker that stopped while running this turn (its lease ran out unrenewed)."""
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """That lease's expiry. Turns that stopped together have it within a renewal interval of each
    other; it is kept after the turn moves on, so they still find each other when taken over one by one."""
    lone_crashes: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Of the crashed deliveries since the last clean end, those in which this was the only turn on its worker."""
    crash_hosts: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list, server_default=text("'{}'::text[]"))
    """Hosts of the workers that stopped while running this turn since its last clean end."""
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    history_turns: Mapped[int | None] = mapped_column(Integer)
    """Succeeded turns of the session up to and including this one; set when this one succeeds."""
    history_messages: Mapped[int | None] = mapped_column(BigInteger)
    """Messages of those turns. History reads what it left out from the last succeeded turn before
    its boundary instead of counting a long session's rows (`handlers.history`)."""
    webhook_url: Mapped[str | None] = mapped_column(Text)
    """Where this turn is POSTed when it ends, instead of its session's `webhook_url`."""
    approval_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """While `awaiting_approval`: when its undecided calls are denied as "timed out" (`CHATQ_APPROVAL_TIMEOUT`)."""
    run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """A delayed turn's due time (kept once it is released); NULL for a turn submitted to run now."""
    pending_input: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """While `delayed`: its user message (`{"content", "images"}`), stored as a message when it is due."""
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    """The schedule whose tick created this turn (docs/contract.md, "Schedules"); NULL: submitted."""


class StepKind(enum.StrEnum):
    """What a journal entry of a turn records (`handlers.journal.StepKind`, the same values)."""

    MODEL = "model"
    TOOL_STARTED = "tool_started"
    TOOL_RESULT = "tool_result"
    APPROVAL_PENDING = "approval_pending"
    APPROVAL_DECIDED = "approval_decided"


class TurnStep(Base):
    """One finished step of a running turn (`worker.store.journal`): what a later attempt resumes after.

    Written under the turn's lease, one small row per step; a turn without tool calls writes none.
    Removed with its turn (and so with its session: delete, retention).
    """

    __tablename__ = "turn_steps"
    __table_args__ = (PrimaryKeyConstraint("turn_id", "seq", name="pk_turn_steps"),)

    turn_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    """1, 2, ... in the order the steps were written."""
    kind: Mapped[StepKind] = mapped_column(
        Enum(
            StepKind,
            name="step_kind",
            native_enum=False,
            length=16,
            values_callable=lambda e: [m.value for m in e],
            create_constraint=True,
        )
    )
    attempt: Mapped[int] = mapped_column(Integer)
    """The attempt (handler invocation) that wrote it."""
    call_id: Mapped[str | None] = mapped_column(String(255))
    """The tool call (`tool_started`, `tool_result`)."""
    tool_name: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """The assistant (`model`) or tool (`tool_result`) message, in `AgentMessage.to_dict()` form;
    `{"args"}` of a call awaiting approval; `{"approve", "args", "reason"}` of a decision."""
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """The model request's token usage (`model`)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


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
    citations: Mapped[list[Any] | None] = mapped_column(JSONB)
    """For an assistant reply based on knowledge-base search: `[{"document_id", "title", "chunk_id", "snippet"}]`."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


# --- knowledge bases -------------------------------------------------------------------------

TEXT_SEARCH_CONFIG = "english"
"""Postgres text search configuration of chunks and queries (stemming and English stop words)."""


class KnowledgeBase(Base):
    """A named collection of documents that sessions can search."""

    __tablename__ = "knowledge_bases"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    """What users and the model call it; unique across tenants (the operator names knowledge bases)."""
    description: Mapped[str | None] = mapped_column(Text)
    tenant: Mapped[str | None] = mapped_column(String(64))
    """The tenant that owns it (`chatq kb create --tenant`); NULL: the operator's, for sessions without a
    tenant. Only sessions of the same tenant (NULL with NULL) attach, read and search it."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Document(Base):
    """A text or markdown document; it can belong to several knowledge bases."""

    __tablename__ = "documents"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    title: Mapped[str] = mapped_column(String(500))
    source_path: Mapped[str | None] = mapped_column(String(2048), unique=True)
    """Absolute path of the file it was read from: adding the same file again updates this document."""
    content: Mapped[str] = mapped_column(Text)
    content_sha256: Mapped[str] = mapped_column(String(64))
    """Digest of `content`; an unchanged file is not re-chunked."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class KnowledgeBaseDocument(Base):
    """Which documents a knowledge base holds (many to many)."""

    __tablename__ = "knowledge_base_documents"
    __table_args__ = (
        PrimaryKeyConstraint("knowledge_base_id", "document_id", name="pk_knowledge_base_documents"),
        Index("ix_knowledge_base_documents_document_id", "document_id"),
    )

    knowledge_base_id: Mapped[int] = mapped_column(ForeignKey("knowledge_bases.id", ondelete="CASCADE"))
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    added_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DocumentChunk(Base):
    """A passage of a document (paragraphs up to a size), the unit of search and citation."""

    __tablename__ = "document_chunks"
    __table_args__ = (
        UniqueConstraint("document_id", "position", name="uq_document_chunks_document_position"),
        Index("ix_document_chunks_search", "search", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    """Order of the chunk within its document, from 0."""
    content: Mapped[str] = mapped_column(Text)
    search: Mapped[str] = mapped_column(
        TSVECTOR, Computed(f"to_tsvector('{TEXT_SEARCH_CONFIG}'::regconfig, content)", persisted=True)
    )
    """Generated by Postgres from `content`; GIN-indexed for full-text search."""


class SessionKnowledgeBase(Base):
    """A knowledge base attached to a chat session: its turns search it first and cite it."""

    __tablename__ = "session_knowledge_bases"
    __table_args__ = (
        PrimaryKeyConstraint("session_id", "knowledge_base_id", name="pk_session_knowledge_bases"),
        Index("ix_session_knowledge_bases_knowledge_base_id", "knowledge_base_id"),
    )

    session_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    knowledge_base_id: Mapped[int] = mapped_column(ForeignKey("knowledge_bases.id", ondelete="CASCADE"))
    attached_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


# --- paid tool calls -------------------------------------------------------------------------


class PaidToolCall(Base):
    """One call of a paid tool, recorded once (see `handlers.accounting.record_tool_call`).

    `(invocation_id, tool_call_id)` is the idempotency key: one handler invocation (one attempt of
    a turn) never records the same call twice, while a retried attempt's calls are new calls that
    cost money again and are recorded again. Costs survive the deletion of their session or turn.
    """

    __tablename__ = "paid_tool_calls"
    __table_args__ = (
        UniqueConstraint("invocation_id", "tool_call_id", name="uq_paid_tool_calls_invocation_call"),
        Index("ix_paid_tool_calls_session_id", "session_id"),
        Index("ix_paid_tool_calls_turn_id", "turn_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    invocation_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    """The handler invocation (one attempt of a turn) that made the call."""
    tool_call_id: Mapped[str] = mapped_column(String(255))
    """The call's id as the model (or the retrieval step) gave it."""
    tool_name: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("chat_sessions.id", ondelete="SET NULL"))
    turn_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("turns.id", ondelete="SET NULL"))
    attempt: Mapped[int | None] = mapped_column(Integer)
    """The turn's attempt (handler invocation number) the call belongs to."""
    units: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    unit_price: Mapped[Decimal] = mapped_column(Numeric(20, 10), default=Decimal(0), server_default=text("0"))
    """Price of one unit when the call was made (the price table can change later)."""
    cost: Mapped[Decimal] = mapped_column(Numeric(20, 10), default=Decimal(0), server_default=text("0"))
    """units * unit_price."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


# --- what is kept of deleted sessions ---------------------------------------------------------


class UsageRollup(Base):
    """Usage of deleted sessions that billing needs, without content or ids (`worker.sessions`).

    A row holds either token totals (`tool_name` NULL) or one paid tool's totals, per day, tenant
    and model of the sessions it sums up.
    """

    __tablename__ = "usage_rollups"
    __table_args__ = (Index("ix_usage_rollups_day", "day"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    day: Mapped[date] = mapped_column(Date)
    """The UTC day the turns (or tool calls) were made."""
    tenant: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    """The sessions' model (NULL: the worker's default)."""
    tool_name: Mapped[str | None] = mapped_column(String(64))
    """NULL for token totals; the paid tool otherwise."""
    turns: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    total_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    tool_calls: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    tool_units: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    tool_cost: Mapped[Decimal] = mapped_column(Numeric(20, 10), default=Decimal(0), server_default=text("0"))
    reason: Mapped[str] = mapped_column(String(16))
    """`deleted` (delete_session) or `retention` (the sweep)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DeletedSession(Base):
    """The SHA-256 digest of a deleted session's id, kept for a while (not the id itself).

    A task message of the session may still wait in Redis; the worker would create an unknown
    session with the defaults, and this tells it not to (`worker.store.inserts.store_turn`).
    """

    __tablename__ = "deleted_sessions"
    __table_args__ = (Index("ix_deleted_sessions_deleted_at", "deleted_at"),)

    digest: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    @staticmethod
    def digest_of(session_id: uuid.UUID) -> bytes:
        """What is stored for a deleted session: the SHA-256 of its id's 16 bytes."""
        return hashlib.sha256(session_id.bytes).digest()


# --- webhooks --------------------------------------------------------------------------------


class DeliveryStatus(enum.StrEnum):
    """Where a webhook delivery is."""

    PENDING = "pending"
    """Not delivered yet: its first attempt or a retry is due."""
    DELIVERED = "delivered"
    """The receiver answered 2xx."""
    FAILED = "failed"
    """Given up: the retry window passed, or the URL is refused (a private address)."""


class DeliveryEvent(enum.StrEnum):
    """What a webhook delivery tells."""

    ENDED = "ended"
    """The turn ended (succeeded, failed or cancelled): the body is the turn as `GET /turns/{id}` returns it."""
    AWAITING_APPROVAL = "awaiting_approval"
    """The turn paused for a person's decision: the body names the waiting calls and the deadline."""


class WebhookDelivery(Base):
    """A POST of a turn to its webhook, retried under the same id: one per pause for approval and
    one when it ends, numbered in that order (`ordinal`)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("turn_id", "ordinal", name="uq_webhook_deliveries_turn_ordinal"),
        Index(
            "ix_webhook_deliveries_turn_ended",
            "turn_id",
            unique=True,
            postgresql_where=text("event = 'ended'"),
        ),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    """The delivery id (`X-Chatq-Delivery`), the same on every attempt: receivers de-duplicate on it."""
    turn_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"))
    event: Mapped[DeliveryEvent] = mapped_column(
        Enum(
            DeliveryEvent,
            name="delivery_event",
            native_enum=False,
            length=32,
            values_callable=lambda e: [m.value for m in e],
            create_constraint=True,
        ),
        default=DeliveryEvent.ENDED,
        server_default=text("'ended'"),
    )
    """Why it is sent: the turn ended (at most one per turn), or it paused for approval (one per pause)."""
    ordinal: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    """Its place among the turn's deliveries: 1, 2, ... in the order they were recorded."""
    url: Mapped[str] = mapped_column(Text)
    """Where it goes (the turn's webhook, else its session's, when the turn paused or ended)."""
    status: Mapped[DeliveryStatus] = mapped_column(
        Enum(
            DeliveryStatus,
            name="delivery_status",
            native_enum=False,
            length=16,
            values_callable=lambda e: [m.value for m in e],
            create_constraint=True,
        ),
        default=DeliveryStatus.PENDING,
    )
    body: Mapped[str | None] = mapped_column(Text)
    """The JSON sent, fixed at the first attempt so every retry sends the same bytes."""
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    """The receiver's HTTP status at the last attempt (None: no answer)."""
    last_error: Mapped[str | None] = mapped_column(Text)
    """Why the last attempt did not deliver (None once delivered)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """While pending: when its next attempt is due (its creation, then each failed attempt's back-off);
    an attempt under way holds it ahead by the attempt's time limit. A row due for longer than
    CHATQ_REQUEUE_GRACE has lost its task message: the sweep sends it again."""
    resends: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """How often the sweep sent its message again; the next re-send waits CHATQ_REQUEUE_GRACE times
    2 to that power (at most 20 graces), so copies do not pile up while no worker takes them."""


class Schedule(Base):
    """A turn submitted again and again: on a cron expression or every N seconds (docs/contract.md, "Schedules")."""

    __tablename__ = "schedules"
    __table_args__ = (
        # The firers' scan: enabled schedules by when they are due.
        Index("ix_schedules_due", "next_run_at", postgresql_where=text("enabled")),
        Index("ix_schedules_tenant_created", "tenant", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str | None] = mapped_column(String(200))
    tenant: Mapped[str | None] = mapped_column(String(64))
    """The tenant that owns it (its session's, or the creating token's); NULL: created without one."""
    session_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True)
    """Each run is a turn of this session; NULL: each run is a new session made from `session_template`."""
    session_template: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    """create_session's arguments (framework, model, system_prompt, metadata) for each run's new session."""
    content: Mapped[str] = mapped_column(Text)
    cron: Mapped[str | None] = mapped_column(String(200))
    every_seconds: Mapped[float | None] = mapped_column(Numeric(asdecimal=False))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC", server_default="UTC")
    overlap: Mapped[str] = mapped_column(String(16), default="skip", server_default="skip")
    misfire: Mapped[str] = mapped_column(String(16), default="once", server_default="once")
    start_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_runs: Mapped[int | None] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    next_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """The next tick's instant; NULL once the schedule is done (end_at or max_runs reached)."""
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Turns created so far (skipped ticks not counted)."""
    skipped: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """Ticks skipped because the previous run was unfinished (overlap=skip) or missed (misfire)."""
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

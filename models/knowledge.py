"""Knowledge bases in Postgres: the bases, their documents and chunks, and session attachments.

Plain functions on SQLAlchemy, no agent framework: the CLI (`chatq kb ...`) and the producer call
these; `models.documents` reads and cuts files, and `models.search` searches what is stored here.

- A document is a text or markdown file, identified by its absolute path: adding the same file
  again (to any knowledge base) updates that one document, and a document can belong to several
  knowledge bases.
- Documents are cut into chunks of whole paragraphs up to `DEFAULT_CHUNK_CHARS` characters (a
  markdown heading starts a new chunk); each chunk is the unit of search and citation.
- Postgres generates each chunk's tsvector (`english` configuration) and keeps it under a GIN
  index, for `models.search`.
- A knowledge base belongs to a tenant (`tenant`, NULL: the operator's, for sessions without a
  tenant). A session attaches, lists and searches only its own tenant's (`same_tenant`); to a
  tenant another tenant's knowledge base is an unknown name, as one that does not exist. Names are
  unique across tenants: the operator (`chatq kb`, which sees every knowledge base) names them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from chatq.errors import InvalidTenant, SessionNotFound
from chatq.tenants import validate_tenant
from models.db import session_scope
from models.documents import DEFAULT_CHUNK_CHARS, MAX_TITLE_CHARS, chunk_text, document_title, read_document_file
from models.errors import DocumentError, KnowledgeBaseError, KnowledgeBaseExists, KnowledgeBaseNotFound
from models.kb_names import EVERY_TENANT, EveryTenant, ids_by_name, normalize_name, same_tenant
from models.tables import (
    ChatSession,
    Document,
    DocumentChunk,
    KnowledgeBase,
    KnowledgeBaseDocument,
    SessionKnowledgeBase,
)

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "EVERY_TENANT",
    "AddedDocument",
    "DocumentError",
    "EveryTenant",
    "KnowledgeBaseError",
    "KnowledgeBaseExists",
    "KnowledgeBaseInfo",
    "KnowledgeBaseNotFound",
    "add_document",
    "add_files",
    "attach_knowledge_bases",
    "chunk_text",
    "create_knowledge_base",
    "detach_knowledge_bases",
    "document_title",
    "ids_by_name",
    "list_knowledge_bases",
    "normalize_name",
    "read_document_file",
    "same_tenant",
    "session_knowledge_bases",
    "set_knowledge_base_tenant",
]


@dataclass(frozen=True, kw_only=True)
class KnowledgeBaseInfo:
    """A knowledge base and how much it holds."""

    id: int
    name: str
    description: str | None = None
    tenant: str | None = None
    """The tenant that owns it; None: the operator's (sessions without a tenant)."""
    documents: int = 0
    chunks: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of `chatq kb ... --json`."""
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "tenant": self.tenant,
            "documents": self.documents,
            "chunks": self.chunks,
        }


@dataclass(frozen=True, kw_only=True)
class AddedDocument:
    """What adding one document did."""

    document_id: int
    title: str
    source_path: str | None
    chunks: int
    """Chunks the document has now."""
    status: str
    """`added` (new document), `updated` (its content changed), `linked` (an unchanged document
    newly added to this knowledge base) or `unchanged`."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of `chatq kb add --json`."""
        return {
            "document_id": self.document_id,
            "title": self.title,
            "source_path": self.source_path,
            "chunks": self.chunks,
            "status": self.status,
        }


# --- knowledge bases -------------------------------------------------------------------------


def create_knowledge_base(name: str, description: str | None = None, *, tenant: str | None = None) -> KnowledgeBaseInfo:
    """Create an empty knowledge base of `tenant` (None: the operator's); KnowledgeBaseExists if the name is taken."""
    clean = normalize_name(name)
    owner = _tenant_name(tenant)
    with session_scope() as db:
        new_id = db.execute(
            pg_insert(KnowledgeBase)
            .values(name=clean, description=(description or "").strip() or None, tenant=owner)
            .on_conflict_do_nothing(index_elements=[KnowledgeBase.name])
            .returning(KnowledgeBase.id)
        ).scalar_one_or_none()
    if new_id is None:
        raise KnowledgeBaseExists(f"knowledge base {clean!r} already exists")
    return KnowledgeBaseInfo(id=int(new_id), name=clean, description=(description or "").strip() or None, tenant=owner)


def _tenant_name(tenant: str | None) -> str | None:
    if tenant is None:
        return None
    try:
        # The one rule of every tenant name (`chatq.tenants`): a knowledge base of a name no session
        # can have would serve nobody.
        return validate_tenant(tenant.strip() if isinstance(tenant, str) else tenant)
    except InvalidTenant as exc:
        raise KnowledgeBaseError(exc.message) from None


def set_knowledge_base_tenant(name: str, tenant: str | None) -> KnowledgeBaseInfo:
    """Give a knowledge base to `tenant` (None: the operator's). Sessions of any other tenant stop
    reading it at once, even where it stays attached."""
    owner = _tenant_name(tenant)
    with session_scope() as db:
        kb_id = ids_by_name(db, [name])[normalize_name(name)]
        db.execute(update(KnowledgeBase).where(KnowledgeBase.id == kb_id).values(tenant=owner))
    return next(info for info in list_knowledge_bases() if info.id == kb_id)


def list_knowledge_bases(tenant: str | EveryTenant | None = EVERY_TENANT) -> list[KnowledgeBaseInfo]:
    """The knowledge bases of `tenant` (default: every one) with their document and chunk counts, by name."""
    documents = (
        select(func.count())
        .select_from(KnowledgeBaseDocument)
        .where(KnowledgeBaseDocument.knowledge_base_id == KnowledgeBase.id)
        .scalar_subquery()
    )
    chunks = (
        select(func.count())
        .select_from(DocumentChunk)
        .join(KnowledgeBaseDocument, KnowledgeBaseDocument.document_id == DocumentChunk.document_id)
        .where(KnowledgeBaseDocument.knowledge_base_id == KnowledgeBase.id)
        .scalar_subquery()
    )
    query = select(
        KnowledgeBase.id, KnowledgeBase.name, KnowledgeBase.description, KnowledgeBase.tenant, documents, chunks
    ).order_by(KnowledgeBase.name)
    if not isinstance(tenant, EveryTenant):
        query = query.where(same_tenant(tenant))
    with session_scope() as db:
        rows = db.execute(query).all()
    return [
        KnowledgeBaseInfo(id=int(r[0]), name=r[1], description=r[2], tenant=r[3], documents=int(r[4]), chunks=int(r[5]))
        for r in rows
    ]


def add_files(
    knowledge_base: str, paths: Sequence[str | Path], *, max_chars: int = DEFAULT_CHUNK_CHARS
) -> list[AddedDocument]:
    """Add text/markdown files to a knowledge base, all or none.

    Every file is read and checked first, so one missing or binary file adds nothing. A file added
    before (by its absolute path) updates its document instead of adding a second one.
    """
    if not paths:
        raise DocumentError("give at least one file to add")
    files = [read_document_file(p) for p in paths]
    with session_scope() as db:
        kb_id = ids_by_name(db, [knowledge_base])[normalize_name(knowledge_base)]
        return [
            _add(db, kb_id, title=title, content=content, source_path=str(resolved), max_chars=max_chars)
            for resolved, title, content in files
        ]


def add_document(
    knowledge_base: str,
    *,
    title: str,
    content: str,
    source_path: str | None = None,
    max_chars: int = DEFAULT_CHUNK_CHARS,
) -> AddedDocument:
    """Add one document from text; with `source_path`, a document of that path is updated instead."""
    clean_title = " ".join(title.split())[:MAX_TITLE_CHARS]
    if not clean_title:
        raise DocumentError("a document needs a title")
    with session_scope() as db:
        kb_id = ids_by_name(db, [knowledge_base])[normalize_name(knowledge_base)]
        return _add(db, kb_id, title=clean_title, content=content, source_path=source_path, max_chars=max_chars)


def _add(
    db: Session, kb_id: int, *, title: str, content: str, source_path: str | None, max_chars: int
) -> AddedDocument:
    digest = hashlib.sha256(content.encode()).hexdigest()
    existing: Document | None = None
    new_id: int | None = None
    if source_path is None:
        new_id = db.execute(
            insert(Document)
            .values(title=title, source_path=None, content=content, content_sha256=digest)
            .returning(Document.id)
        ).scalar_one()
    else:
        by_path = select(Document).where(Document.source_path == source_path).with_for_update()
        existing = db.execute(by_path).scalar_one_or_none()
        if existing is None:
            # Two adds of a new file at once: one inserts, the other waits for it, then updates.
            new_id = db.execute(
                pg_insert(Document)
                .values(title=title, source_path=source_path, content=content, content_sha256=digest)
                .on_conflict_do_nothing(index_elements=[Document.source_path])
                .returning(Document.id)
            ).scalar_one_or_none()
            if new_id is None:
                existing = db.execute(by_path).scalar_one()
    if existing is None:
        assert new_id is not None
        document_id, status, rechunk = int(new_id), "added", True
    else:
        document_id = int(existing.id)
        rechunk = existing.content_sha256 != digest
        status = "updated" if rechunk or existing.title != title else "unchanged"
        if status == "updated":
            db.execute(
                update(Document)
                .where(Document.id == document_id)
                .values(title=title, content=content, content_sha256=digest, updated_at=func.now())
            )
    if rechunk:
        chunks = chunk_text(content, max_chars)
        db.execute(delete(DocumentChunk).where(DocumentChunk.document_id == document_id))
        if chunks:
            db.execute(
                insert(DocumentChunk),
                [{"document_id": document_id, "position": i, "content": chunk} for i, chunk in enumerate(chunks)],
            )
        chunk_count = len(chunks)
    else:
        chunk_count = db.execute(
            select(func.count()).select_from(DocumentChunk).where(DocumentChunk.document_id == document_id)
        ).scalar_one()
    linked = db.execute(
        pg_insert(KnowledgeBaseDocument)
        .values(knowledge_base_id=kb_id, document_id=document_id)
        .on_conflict_do_nothing()
        .returning(KnowledgeBaseDocument.document_id)
    ).scalar_one_or_none()
    if status == "unchanged" and linked is not None:
        status = "linked"
    return AddedDocument(
        document_id=document_id, title=title, source_path=source_path, chunks=int(chunk_count), status=status
    )


# --- sessions --------------------------------------------------------------------------------


def _session_uuid(session_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(session_id, uuid.UUID):
        return session_id
    try:
        return uuid.UUID(str(session_id))
    except ValueError:
        raise SessionNotFound(f"not a session id: {str(session_id)[:60]!r}") from None


def attach_knowledge_bases(
    session_id: uuid.UUID | str, names: Sequence[str], *, db: Session | None = None
) -> list[str]:
    """Attach knowledge bases of the session's tenant to a session (idempotent); returns the
    session's knowledge bases after.

    Pass `db` to do it inside the caller's transaction (e.g. `create_session`, so a typo in a name
    creates no session). Raises SessionNotFound or KnowledgeBaseNotFound (also for another
    tenant's knowledge base), attaching nothing.
    """
    sid = _session_uuid(session_id)
    if db is None:
        with session_scope() as own:
            return attach_knowledge_bases(sid, names, db=own)
    db.flush()  # a session added in this transaction must be visible to the check below
    session = db.execute(select(ChatSession.tenant).where(ChatSession.id == sid)).one_or_none()
    if session is None:
        raise SessionNotFound(f"session {sid} does not exist")
    ids = ids_by_name(db, names, tenant=session.tenant)
    if ids:
        db.execute(
            pg_insert(SessionKnowledgeBase)
            .values([{"session_id": sid, "knowledge_base_id": kb_id} for kb_id in ids.values()])
            .on_conflict_do_nothing()
        )
    return _session_names(db, sid)


def detach_knowledge_bases(session_id: uuid.UUID | str, names: Sequence[str]) -> list[str]:
    """Detach knowledge bases from a session; returns the session's knowledge bases after."""
    sid = _session_uuid(session_id)
    with session_scope() as db:
        if db.get(ChatSession, sid) is None:
            raise SessionNotFound(f"session {sid} does not exist")
        ids = ids_by_name(db, names)
        db.execute(
            delete(SessionKnowledgeBase).where(
                SessionKnowledgeBase.session_id == sid, SessionKnowledgeBase.knowledge_base_id.in_(ids.values())
            )
        )
        return _session_names(db, sid)


def session_knowledge_bases(session_id: uuid.UUID | str) -> list[str]:
    """Names of the knowledge bases of its tenant attached to a session, sorted (empty for an unknown session)."""
    try:
        sid = _session_uuid(session_id)
    except SessionNotFound:
        return []
    with session_scope() as db:
        return _session_names(db, sid)


def _session_names(db: Session, session_id: uuid.UUID) -> list[str]:
    # Only its own tenant's: an attachment to another tenant's knowledge base (one given to another
    # tenant after it was attached) is never read.
    return list(
        db.execute(
            select(KnowledgeBase.name)
            .join(SessionKnowledgeBase, SessionKnowledgeBase.knowledge_base_id == KnowledgeBase.id)
            .join(ChatSession, ChatSession.id == SessionKnowledgeBase.session_id)
            .where(SessionKnowledgeBase.session_id == session_id, same_tenant(ChatSession.tenant))
            .order_by(KnowledgeBase.name)
        ).scalars()
    )

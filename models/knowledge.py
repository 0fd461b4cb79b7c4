"""Knowledge bases in Postgres: documents, chunks, full-text search, session attachments.

Plain functions on SQLAlchemy, no agent framework: the CLI (`chatq kb ...`), the producer and the
`search_knowledge_base` tool all call these.

- A document is a text or markdown file, identified by its absolute path: adding the same file
  again (to any knowledge base) updates that one document, and a document can belong to several
  knowledge bases.
- Documents are cut into chunks of whole paragraphs up to `DEFAULT_CHUNK_CHARS` characters (a
  markdown heading starts a new chunk); each chunk is the unit of search and citation.
- Postgres generates each chunk's tsvector (`english` configuration) and keeps it under a GIN
  index. A query matches a chunk that has any of its words; chunks with all of them come first,
  then by `ts_rank_cd` (cover density). Each hit carries a `ts_headline` snippet with the matched
  words in `**bold**`, and its document's id and title.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, bindparam, delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from models.db import session_scope
from models.tables import (
    TEXT_SEARCH_CONFIG,
    ChatSession,
    Document,
    DocumentChunk,
    KnowledgeBase,
    KnowledgeBaseDocument,
    SessionKnowledgeBase,
)
from worker.errors import ChatqError, SessionNotFound

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "DEFAULT_SEARCH_LIMIT",
    "AddedDocument",
    "DocumentError",
    "KnowledgeBaseError",
    "KnowledgeBaseExists",
    "KnowledgeBaseInfo",
    "KnowledgeBaseNotFound",
    "SearchHit",
    "add_document",
    "add_files",
    "attach_knowledge_bases",
    "chunk_text",
    "create_knowledge_base",
    "detach_knowledge_bases",
    "document_title",
    "list_knowledge_bases",
    "read_document_file",
    "search",
    "session_knowledge_bases",
]

DEFAULT_CHUNK_CHARS = 1200
"""Largest chunk, in characters: whole paragraphs are packed up to this size."""
DEFAULT_SEARCH_LIMIT = 5
MAX_SEARCH_LIMIT = 50
MAX_QUERY_CHARS = 1000
"""Longer queries (a long user message used as the retrieval query) are cut to this."""
MAX_NAME_CHARS = 100
MAX_TITLE_CHARS = 500
MAX_PATH_CHARS = 2048
MAX_DOCUMENT_BYTES = 10_000_000
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd"})

HEADLINE_OPTIONS = (
    'StartSel=**, StopSel=**, MaxWords=35, MinWords=12, ShortWord=2, MaxFragments=2, FragmentDelimiter=" … "'
)
"""`ts_headline` options: up to two fragments of the chunk around the matched words, in **bold**."""


class KnowledgeBaseError(ChatqError):
    """The knowledge base operation failed."""


class KnowledgeBaseNotFound(KnowledgeBaseError):
    """No such knowledge base."""


class KnowledgeBaseExists(KnowledgeBaseError):
    """A knowledge base of that name already exists."""


class DocumentError(KnowledgeBaseError):
    """The document cannot be added."""


@dataclass(frozen=True, kw_only=True)
class KnowledgeBaseInfo:
    """A knowledge base and how much it holds."""

    id: int
    name: str
    description: str | None = None
    documents: int = 0
    chunks: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of `chatq kb ... --json`."""
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
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


@dataclass(frozen=True, kw_only=True)
class SearchHit:
    """One matching chunk, best first."""

    chunk_id: int
    document_id: int
    title: str
    """The document's title."""
    position: int
    """The chunk's position in its document."""
    content: str
    """The whole chunk (what the model reads)."""
    snippet: str
    """A short extract around the matched words, which are in **bold** (what people and citations show)."""
    rank: float
    """`ts_rank_cd` of the chunk for the query."""
    all_terms: bool
    """True if the chunk has every word of the query."""
    source_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of `chatq kb search --json`."""
        return {
            "document_id": self.document_id,
            "title": self.title,
            "chunk_id": self.chunk_id,
            "position": self.position,
            "rank": round(self.rank, 6),
            "all_terms": self.all_terms,
            "snippet": self.snippet,
            "source_path": self.source_path,
        }

    def citation(self) -> dict[str, Any]:
        """The structured citation of this hit: `{"document_id", "title", "chunk_id", "snippet"}`."""
        return {
            "document_id": self.document_id,
            "title": self.title,
            "chunk_id": self.chunk_id,
            "snippet": self.snippet,
        }


# --- names -----------------------------------------------------------------------------------


def normalize_name(name: str) -> str:
    """A knowledge base name as stored: one line, trimmed, 1-100 characters."""
    if not isinstance(name, str):
        raise KnowledgeBaseError("a knowledge base name must be text")
    clean = " ".join(name.split())
    if not clean:
        raise KnowledgeBaseError("a knowledge base name cannot be empty")
    if len(clean) > MAX_NAME_CHARS:
        raise KnowledgeBaseError(f"a knowledge base name is at most {MAX_NAME_CHARS} characters")
    return clean


def _ids_by_name(db: Session, names: Iterable[str]) -> dict[str, int]:
    """Ids of the named knowledge bases; KnowledgeBaseNotFound naming every unknown one."""
    wanted = list(dict.fromkeys(normalize_name(n) for n in names))
    if not wanted:
        return {}
    rows = db.execute(select(KnowledgeBase.name, KnowledgeBase.id).where(KnowledgeBase.name.in_(wanted))).all()
    found = {row.name: int(row.id) for row in rows}
    missing = [n for n in wanted if n not in found]
    if missing:
        noun = "knowledge base" if len(missing) == 1 else "knowledge bases"
        raise KnowledgeBaseNotFound(f"unknown {noun}: {', '.join(missing)} (create one with `chatq kb create NAME`)")
    return {name: found[name] for name in wanted}


# --- knowledge bases -------------------------------------------------------------------------


def create_knowledge_base(name: str, description: str | None = None) -> KnowledgeBaseInfo:
    """Create an empty knowledge base; KnowledgeBaseExists if the name is taken."""
    clean = normalize_name(name)
    with session_scope() as db:
        new_id = db.execute(
            pg_insert(KnowledgeBase)
            .values(name=clean, description=(description or "").strip() or None)
            .on_conflict_do_nothing(index_elements=[KnowledgeBase.name])
            .returning(KnowledgeBase.id)
        ).scalar_one_or_none()
    if new_id is None:
        raise KnowledgeBaseExists(f"knowledge base {clean!r} already exists")
    return KnowledgeBaseInfo(id=int(new_id), name=clean, description=(description or "").strip() or None)


def list_knowledge_bases() -> list[KnowledgeBaseInfo]:
    """Every knowledge base with its document and chunk counts, by name."""
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
    with session_scope() as db:
        rows = db.execute(
            select(KnowledgeBase.id, KnowledgeBase.name, KnowledgeBase.description, documents, chunks).order_by(
                KnowledgeBase.name
            )
        ).all()
    return [
        KnowledgeBaseInfo(id=int(r[0]), name=r[1], description=r[2], documents=int(r[3]), chunks=int(r[4]))
        for r in rows
    ]


# --- documents -------------------------------------------------------------------------------

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+\S")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_H1 = re.compile(r"^ {0,3}#\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def chunk_text(text: str, max_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """Cut a document into chunks of whole paragraphs, each at most `max_chars` characters.

    Paragraphs (separated by blank lines) are packed together while they fit; a markdown heading
    starts a new chunk so a section's text stays with its heading; a paragraph longer than
    `max_chars` is cut at sentence ends, then between words, then anywhere.
    """
    if max_chars < 20:
        raise ValueError("max_chars must be at least 20")
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    pieces: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(normalized):
        stripped = paragraph.strip()
        if stripped:
            pieces.extend(_split_long(stripped, max_chars))
    chunks: list[str] = []
    current = ""
    only_headings = False
    for piece in pieces:
        heading = _HEADING.match(piece) is not None
        if current and heading and not only_headings:
            chunks.append(current)
            current = ""
        if not current:
            current, only_headings = piece, heading
        elif len(current) + 2 + len(piece) <= max_chars:
            current = f"{current}\n\n{piece}"
            only_headings = only_headings and heading
        else:
            chunks.append(current)
            current, only_headings = piece, heading
    if current:
        chunks.append(current)
    return chunks


def _split_long(paragraph: str, max_chars: int) -> list[str]:
    if len(paragraph) <= max_chars:
        return [paragraph]
    parts: list[str] = []
    for sentence in _SENTENCE_END.split(paragraph):
        if len(sentence) <= max_chars:
            parts.append(sentence)
            continue
        for word in sentence.split():
            parts.extend(word[i : i + max_chars] for i in range(0, len(word), max_chars))
    out: list[str] = []
    current = ""
    for part in parts:
        if not current:
            current = part
        elif len(current) + 1 + len(part) <= max_chars:
            current = f"{current} {part}"
        else:
            out.append(current)
            current = part
    if current:
        out.append(current)
    return out


def document_title(path: Path, content: str) -> str:
    """A markdown file's first `# Heading`, otherwise the file name without its extension."""
    if path.suffix.lower() in MARKDOWN_SUFFIXES:
        match = _H1.search(content)
        if match:
            return " ".join(match["title"].split())[:MAX_TITLE_CHARS]
    return (path.stem or path.name)[:MAX_TITLE_CHARS]


def read_document_file(path: str | Path) -> tuple[Path, str, str]:
    """(absolute path, title, content) of a text or markdown file; DocumentError says what is wrong."""
    given = str(path)
    file = Path(path).expanduser()
    if not file.exists():
        raise DocumentError(f"file not found: {given}")
    if not file.is_file():
        raise DocumentError(f"not a file: {given}")
    resolved = file.resolve()
    if len(str(resolved)) > MAX_PATH_CHARS:
        raise DocumentError(f"file path is longer than {MAX_PATH_CHARS} characters: {given}")
    try:
        size = resolved.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DocumentError(f"file is larger than {MAX_DOCUMENT_BYTES} bytes: {given}")
        data = resolved.read_bytes()
    except OSError as exc:
        raise DocumentError(f"cannot read {given}: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise DocumentError(f"not a text file: {given} (only UTF-8 text and markdown can be added)")
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentError(f"not UTF-8 text: {given} (only UTF-8 text and markdown can be added)") from None
    return resolved, document_title(resolved, content), content


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
        kb_id = _ids_by_name(db, [knowledge_base])[normalize_name(knowledge_base)]
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
        kb_id = _ids_by_name(db, [knowledge_base])[normalize_name(knowledge_base)]
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


# --- search ----------------------------------------------------------------------------------

_QUERIES = text(
    """
    SELECT websearch_to_tsquery(CAST(:config AS regconfig), :query)::text AS q_all,
           (SELECT string_agg(quote_literal(lexeme), ' | ')
              FROM unnest(tsvector_to_array(to_tsvector(CAST(:config AS regconfig), :query))) AS lexeme) AS q_any
    """
)

# The tsqueries arrive as constants, so the planner can use the GIN index on `search`; the
# headline (the costly part) is computed for the top `limit` chunks only.
_SEARCH = text(
    """
    WITH hits AS (
        SELECT c.id, c.document_id, c.position, c.content,
               ts_rank_cd(c.search, CAST(:q_any AS tsquery)) AS rank,
               c.search @@ CAST(:q_all AS tsquery) AS all_terms
          FROM document_chunks AS c
         WHERE c.search @@ CAST(:q_any AS tsquery)
           AND EXISTS (SELECT 1 FROM knowledge_base_documents AS kd
                        WHERE kd.document_id = c.document_id AND kd.knowledge_base_id = ANY(:kb_ids))
         ORDER BY all_terms DESC, rank DESC, c.id
         LIMIT :limit
    )
    SELECT h.id AS chunk_id, h.document_id, h.position, h.content, h.rank, h.all_terms,
           d.title, d.source_path,
           ts_headline(CAST(:config AS regconfig), h.content, CAST(:q_any AS tsquery), :options) AS snippet
      FROM hits AS h JOIN documents AS d ON d.id = h.document_id
     ORDER BY h.all_terms DESC, h.rank DESC, h.id
    """
).bindparams(bindparam("kb_ids", type_=ARRAY(BigInteger)))


_STRICT_SYNTAX = re.compile(r'"|(?:^|\s)-\w')
"""Web-search syntax that makes a search strict: a quoted phrase or a `-word` (not a hyphenated word)."""


def search(
    knowledge_bases: Sequence[str], query: str, *, limit: int = DEFAULT_SEARCH_LIMIT, db: Session | None = None
) -> list[SearchHit]:
    """The chunks of these knowledge bases that best match `query`, best first.

    A chunk matches when it has any word of the query (after stemming, stop words dropped), so a
    question in plain words finds passages that answer part of it; chunks with every word come
    first, then by `ts_rank_cd`. Web-search syntax makes it strict: `"a phrase"` and `-word`
    must hold as written (`websearch_to_tsquery`). A document in several of the knowledge bases
    is found once. Raises KnowledgeBaseNotFound for an unknown name.
    """
    limit = max(1, min(int(limit), MAX_SEARCH_LIMIT))
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if db is None:
        with session_scope() as own:
            return search(knowledge_bases, query, limit=limit, db=own)
    kb_ids = list(_ids_by_name(db, knowledge_bases).values())
    if not kb_ids or not query:
        return []
    queries = db.execute(_QUERIES, {"config": TEXT_SEARCH_CONFIG, "query": query}).one()
    q_all, q_any = queries.q_all or "", queries.q_any or ""
    if _STRICT_SYNTAX.search(query):
        q_any = q_all  # "a phrase" or -word: the user asked for exactly that
    if not q_any:
        return []  # nothing searchable: only stop words or punctuation
    rows = db.execute(
        _SEARCH,
        {
            "config": TEXT_SEARCH_CONFIG,
            "q_any": q_any,
            "q_all": q_all or q_any,
            "kb_ids": kb_ids,
            "limit": limit,
            "options": HEADLINE_OPTIONS,
        },
    ).all()
    return [
        SearchHit(
            chunk_id=int(row.chunk_id),
            document_id=int(row.document_id),
            title=row.title,
            position=int(row.position),
            content=row.content,
            snippet=" ".join(str(row.snippet or "").split()),
            rank=float(row.rank),
            all_terms=bool(row.all_terms),
            source_path=row.source_path,
        )
        for row in rows
    ]


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
    """Attach knowledge bases to a session (idempotent); returns the session's knowledge bases after.

    Pass `db` to do it inside the caller's transaction (e.g. `create_session`, so a typo in a name
    creates no session). Raises SessionNotFound or KnowledgeBaseNotFound, attaching nothing.
    """
    sid = _session_uuid(session_id)
    if db is None:
        with session_scope() as own:
            return attach_knowledge_bases(sid, names, db=own)
    db.flush()  # a session added in this transaction must be visible to the check below
    if db.execute(select(ChatSession.id).where(ChatSession.id == sid)).scalar_one_or_none() is None:
        raise SessionNotFound(f"session {sid} does not exist")
    ids = _ids_by_name(db, names)
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
        ids = _ids_by_name(db, names)
        db.execute(
            delete(SessionKnowledgeBase).where(
                SessionKnowledgeBase.session_id == sid, SessionKnowledgeBase.knowledge_base_id.in_(ids.values())
            )
        )
        return _session_names(db, sid)


def session_knowledge_bases(session_id: uuid.UUID | str) -> list[str]:
    """Names of the knowledge bases attached to a session, sorted (empty for an unknown session)."""
    try:
        sid = _session_uuid(session_id)
    except SessionNotFound:
        return []
    with session_scope() as db:
        return _session_names(db, sid)


def _session_names(db: Session, session_id: uuid.UUID) -> list[str]:
    return list(
        db.execute(
            select(KnowledgeBase.name)
            .join(SessionKnowledgeBase, SessionKnowledgeBase.knowledge_base_id == KnowledgeBase.id)
            .where(SessionKnowledgeBase.session_id == session_id)
            .order_by(KnowledgeBase.name)
        ).scalars()
    )

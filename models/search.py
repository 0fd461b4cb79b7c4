"""Full-text search over knowledge bases: the chunks that best match a query, with snippets.

Postgres generates each chunk's tsvector (`english` configuration) under a GIN index. A query
matches a chunk that has any of its words; chunks with all of them come first, then by
`ts_rank_cd` (cover density). Each hit carries a `ts_headline` snippet with the matched words in
`**bold**`, and its document's id and title.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, bindparam, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from models.db import session_scope
from models.kb_names import EVERY_TENANT, EveryTenant, ids_by_name
from models.tables import TEXT_SEARCH_CONFIG, ChatSession

__all__ = ["DEFAULT_SEARCH_LIMIT", "MAX_QUERY_CHARS", "MAX_SEARCH_LIMIT", "SearchHit", "search"]

DEFAULT_SEARCH_LIMIT = 5
MAX_SEARCH_LIMIT = 50
MAX_QUERY_CHARS = 1000
"""Longer queries (a long user message used as the retrieval query) are cut to this."""
HEADLINE_OPTIONS = (
    'StartSel=**, StopSel=**, MaxWords=35, MinWords=12, ShortWord=2, MaxFragments=2, FragmentDelimiter=" … "'
)
"""`ts_headline` options: up to two fragments of the chunk around the matched words, in **bold**."""


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
    knowledge_bases: Sequence[str],
    query: str,
    *,
    limit: int = DEFAULT_SEARCH_LIMIT,
    session_id: uuid.UUID | None = None,
    db: Session | None = None,
) -> list[SearchHit]:
    """The chunks of these knowledge bases that best match `query`, best first.

    A chunk matches when it has any word of the query (after stemming, stop words dropped), so a
    question in plain words finds passages that answer part of it; chunks with every word come
    first, then by `ts_rank_cd`. Web-search syntax makes it strict: `"a phrase"` and `-word`
    must hold as written (`websearch_to_tsquery`). A document in several of the knowledge bases
    is found once. Raises KnowledgeBaseNotFound for an unknown name.

    With `session_id` (a turn's search) only that session's tenant's knowledge bases are searched:
    another tenant's name is unknown, and a session that is gone finds nothing.
    """
    limit = max(1, min(int(limit), MAX_SEARCH_LIMIT))
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if db is None:
        with session_scope() as own:
            return search(knowledge_bases, query, limit=limit, session_id=session_id, db=own)
    tenant: str | EveryTenant | None = EVERY_TENANT
    if session_id is not None:
        session = db.execute(select(ChatSession.tenant).where(ChatSession.id == session_id)).one_or_none()
        if session is None:
            return []
        tenant = session.tenant
    kb_ids = list(ids_by_name(db, knowledge_bases, tenant=tenant).values())
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

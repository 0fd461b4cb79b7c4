"""The `search_knowledge_base` tool's function: search the current session's knowledge bases.

Its own module so the tool registry (`handlers.tools`) can name it without importing the rest of
`handlers.knowledge`, which builds on the registry (no import cycle).
"""

from __future__ import annotations

from handlers.context import current_tool_context
from models.search import SearchHit, search

__all__ = ["NO_KNOWLEDGE_BASE", "format_hits", "search_tool"]

NO_KNOWLEDGE_BASE = "No knowledge base is attached to this conversation; answer without searching."


def search_tool(query: str, limit: int = 5) -> str:
    """`search_knowledge_base`: search the current session's knowledge bases, remember the hits."""
    context = current_tool_context()
    if context is None or not context.knowledge_bases:
        raise ValueError(NO_KNOWLEDGE_BASE)
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError("limit must be an integer")
    # The session's own tenant's knowledge bases only, whatever names its context holds.
    hits = search(context.knowledge_bases, query, limit=max(1, min(limit, 10)), session_id=context.session_id)
    context.retrieved.add([hit.citation() for hit in hits])
    return format_hits(query, hits)


def format_hits(query: str, hits: list[SearchHit]) -> str:
    """The tool result the model reads: each passage in full under its document's title and id."""
    shown = " ".join(query.split())
    if not hits:
        return f'No passage of the knowledge base matches "{shown}".'
    noun = "passage" if len(hits) == 1 else "passages"
    lines = [
        f'{len(hits)} {noun} from the knowledge base for "{shown}". '
        "Cite the title of each passage you use in your answer."
    ]
    for index, hit in enumerate(hits, start=1):
        lines.append(f"\n[{index}] {hit.title} (document {hit.document_id})\n{hit.content}")
    return "\n".join(lines)

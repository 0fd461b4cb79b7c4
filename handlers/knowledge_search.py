"""The `search_knowledge_base` tool's function: search the current session's knowledge bases.

The search itself is the store's (`ToolContext.search`, bound to the session and its own tenant's
knowledge bases when the invocation starts); this module reads nothing itself.

Its own module so the tool registry (`handlers.tool_registry`) can name it without importing the rest of
`handlers.knowledge`, which builds on the registry (no import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers.context import current_tool_context
from handlers.store import SearchHit

__all__ = ["NO_KNOWLEDGE_BASE", "format_hits", "search_tool"]

NO_KNOWLEDGE_BASE = "No knowledge base is attached to this conversation; answer without searching."


def search_tool(query: str, limit: int = 5) -> str:
    """`search_knowledge_base`: search the current session's knowledge bases, remember the hits."""
    context = current_tool_context()
    if context is None or not context.knowledge_bases or context.search is None:
        raise ValueError(NO_KNOWLEDGE_BASE)
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError("limit must be an integer")
    # The store bound the search to the session: its own tenant's knowledge bases only.
    hits = context.search(query, max(1, min(limit, 10)))
    context.retrieved.add([hit.citation() for hit in hits])
    return format_hits(query, hits)


def format_hits(query: str, hits: Sequence[SearchHit]) -> str:
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

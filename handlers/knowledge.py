"""Knowledge bases as every framework uses them: the search tool, the first retrieval step, citations.

Framework-neutral (no agent framework imported): adapters turn what these return into their own
message types.

- `start_invocation(session)`: the `ToolContext` of one invocation, with the session's knowledge
  bases (one query); an empty tuple means "none attached: do not bind or call the search tool".
- `retrieval_step(context, question)`: the first step of every question when knowledge bases are
  attached: a `search_knowledge_base` call with the user's message as the query, run (and, being a
  paid tool, recorded) like any tool call. Adapters add it to the conversation as an assistant
  tool call and its tool result, so the model's first request already holds the search result.
- `choose_citations(context, answer)`: the structured citations of the final answer,
  `[{"document_id", "title", "chunk_id", "snippet"}]`: the passages found during the invocation
  whose document the answer names (by title, or "document <id>"); when it names none, every
  passage found, since the answer was based on them. None when nothing was found.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from handlers.context import ToolContext, current_tool_context
from handlers.tools import KNOWLEDGE_BASE_TOOL, run_tool
from models.knowledge import session_knowledge_bases
from models.search import MAX_QUERY_CHARS, SearchHit, search

__all__ = [
    "MAX_CITATIONS",
    "NO_KNOWLEDGE_BASE",
    "choose_citations",
    "format_hits",
    "retrieval_step",
    "search_tool",
    "start_invocation",
]

MAX_CITATIONS = 10
NO_KNOWLEDGE_BASE = "No knowledge base is attached to this conversation; answer without searching."
NO_QUESTION = "The message has no text to search the knowledge base for."


def start_invocation(session: Any) -> ToolContext:
    """A fresh `ToolContext` for one invocation on `session`, with its attached knowledge bases.

    A worker's claim already read them (`SessionInfo.knowledge_bases`); anything else is looked up.
    """
    known = getattr(session, "knowledge_bases", None)
    names = known if known is not None else session_knowledge_bases(session.id)
    return ToolContext.for_session(session, knowledge_bases=names)


def search_tool(query: str, limit: int = 5) -> str:
    """`search_knowledge_base`: search the current session's knowledge bases, remember the hits."""
    context = current_tool_context()
    if context is None or not context.knowledge_bases:
        raise ValueError(NO_KNOWLEDGE_BASE)
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError("limit must be an integer")
    hits = search(context.knowledge_bases, query, limit=max(1, min(limit, 10)))
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


def retrieval_step(context: ToolContext, question: str) -> tuple[dict[str, Any], str]:
    """Search the knowledge bases for `question`: the tool call `{"id", "name", "args"}` and its result."""
    call_id = f"kb_{uuid.uuid4().hex[:24]}"
    args = {"query": " ".join(question.split())[:MAX_QUERY_CHARS]}
    if not args["query"]:
        # Nothing to search for (a message of images only): no call is made, none is paid.
        return {"id": call_id, "name": KNOWLEDGE_BASE_TOOL, "args": args}, NO_QUESTION
    output = run_tool(KNOWLEDGE_BASE_TOOL, args, context=context.for_call(call_id))
    return {"id": call_id, "name": KNOWLEDGE_BASE_TOOL, "args": args}, output


def choose_citations(context: ToolContext, answer: str) -> list[dict[str, Any]] | None:
    """The citations of `answer` among the passages found in this invocation (see the module docstring)."""
    hits = context.retrieved.hits()
    if not hits:
        return None
    text = " ".join(answer.casefold().split())
    named = {hit["document_id"] for hit in hits if _names_document(text, hit)}
    cited = [hit for hit in hits if hit["document_id"] in named] or hits
    return cited[:MAX_CITATIONS]


def _names_document(text: str, hit: dict[str, Any]) -> bool:
    title = " ".join(str(hit.get("title") or "").casefold().split())
    if title and title in text:
        return True
    return re.search(rf"\bdoc(?:ument)?\s*#?\s*{int(hit['document_id'])}\b", text) is not None

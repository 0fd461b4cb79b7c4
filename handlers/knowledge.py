"""Knowledge bases as every framework uses them: the search tool, the first retrieval step, citations.

Framework-neutral (no agent framework imported): adapters turn what these return into their own
message types.

- `start_invocation(session, store, settings)`: the `ToolContext` of one invocation, with the session's
  knowledge bases (from the store, unless the worker's claim already read them), the store's search
  bound to them and its recorder of paid calls; an empty tuple of knowledge bases means "none
  attached: do not bind or call the search tool".
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

import dataclasses
import re
import uuid
from typing import Any

from handlers.context import ToolContext
from handlers.handler_settings import ToolSettings
from handlers.knowledge_search import NO_KNOWLEDGE_BASE, format_hits, search_tool
from handlers.messages import AgentMessage, empty_usage
from handlers.store import TurnStore
from handlers.tool_registry import KNOWLEDGE_BASE_TOOL
from handlers.tools import run_tool
from models.search import MAX_QUERY_CHARS

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
NO_QUESTION = "The message has no text to search the knowledge base for."


def start_invocation(session: Any, store: TurnStore, settings: ToolSettings) -> ToolContext:
    """A fresh `ToolContext` for one invocation on `session`, its knowledge bases, search and recorder,
    and the tool `settings` handed in.

    A worker's claim already read the knowledge bases (`SessionInfo.knowledge_bases`); else the
    store is asked. Errors of the store pass through unchanged.
    """
    context = ToolContext.for_session(session, recorder=store.recorder(), settings=settings)
    if context.session_id is None:
        return context
    known = getattr(session, "knowledge_bases", None)
    names = tuple(known if known is not None else store.knowledge_bases(context.session_id))
    search = store.searcher(context.session_id, names) if names else None
    return dataclasses.replace(context, knowledge_bases=names, search=search)


def retrieval_step(context: ToolContext, question: str) -> tuple[dict[str, Any], str]:
    """Search the knowledge bases for `question`: the tool call `{"id", "name", "args"}` and its result.

    With a journal on `context` the step is recorded as the model's would be (the call, then its
    start and result, through `run_tool`), so a resumed attempt finds it among the finished steps.
    """
    call_id = f"kb_{uuid.uuid4().hex[:24]}"
    args = {"query": " ".join(question.split())[:MAX_QUERY_CHARS]}
    call = {"id": call_id, "name": KNOWLEDGE_BASE_TOOL, "args": args}
    journal = context.journal
    if journal is not None:
        journal.model_step(AgentMessage(role="assistant", content="", tool_calls=[dict(call)]), empty_usage())
    if not args["query"]:
        # Nothing to search for (a message of images only): no call is made, none is paid.
        if journal is not None:
            journal.tool_finished(call_id, AgentMessage(role="tool", content=NO_QUESTION, tool_call_id=call_id))
        return call, NO_QUESTION
    output = run_tool(KNOWLEDGE_BASE_TOOL, args, context=context.for_call(call_id))
    return call, output


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

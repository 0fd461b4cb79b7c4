"""What handlers/ needs of the store, as protocols: handlers/ never queries Postgres itself.

A turn's data is handed in. The worker gives `build_turn_input` a `TurnStore` (chatq's is
`models.turn_store.PostgresTurnStore`); the store hands over the session's history rows (which
`handlers.history.trim_history` cuts to the token budget), its knowledge bases, a knowledge-base
search bound to the session and the recorder of paid tool calls, and the last two travel on the
invocation's `ToolContext`. Errors of the store pass through handlers/ unchanged, for the worker
to classify (an outage is retried, see `worker/storable.py`).

`default_store()` is the Postgres store, for callers of an adapter's `invoke`/`stream` outside the
worker (tests, scripts) that hand none in.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import Any, Protocol

__all__ = [
    "EarlierHistory",
    "HistoryPages",
    "HistoryRow",
    "KnowledgeSearch",
    "PaidCallRecorder",
    "SearchHit",
    "TurnStore",
    "default_store",
]


class HistoryRow(Protocol):
    """One stored message of a succeeded turn (`models.history.HistoryRow`)."""

    @property
    def position(self) -> int: ...
    @property
    def turn_id(self) -> Any: ...
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[dict[str, Any]] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...


class EarlierHistory(Protocol):
    """What precedes a position in the history: message and turn counts, first words of the earliest."""

    @property
    def messages(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def snippets(self) -> Sequence[str]: ...


class HistoryPages(Protocol):
    """A session's history below a starting position (the `reply_to` message, else the end)."""

    def page(self, cursor: int | None, limit: int) -> Sequence[HistoryRow]:
        """Up to `limit` rows below position `cursor` (None: below the start), newest first."""
        ...

    def earlier(self, boundary: int | None) -> EarlierHistory:
        """What lies below position `boundary` (None: below the start)."""
        ...


class SearchHit(Protocol):
    """One passage found in a knowledge base (`models.search.SearchHit`)."""

    @property
    def document_id(self) -> int: ...
    @property
    def title(self) -> str: ...
    @property
    def content(self) -> str: ...
    def citation(self) -> dict[str, Any]:
        """`{"document_id", "title", "chunk_id", "snippet"}`."""
        ...


class KnowledgeSearch(Protocol):
    """A knowledge-base search bound to one session and its knowledge bases."""

    def __call__(self, query: str, limit: int, /) -> Sequence[SearchHit]: ...


class PaidCallRecorder(Protocol):
    """Stores one paid tool call once per (invocation, call id); True if stored now, False if already."""

    def __call__(
        self,
        *,
        tool_name: str,
        tool_call_id: str,
        invocation_id: uuid.UUID,
        session_id: uuid.UUID | None,
        turn_id: uuid.UUID | None,
        attempt: int | None,
        units: int,
        unit_price: Decimal,
    ) -> bool: ...


class TurnStore(Protocol):
    """Where a turn's data comes from and its paid calls go."""

    def history(self, session_id: uuid.UUID, reply_to: int | None) -> AbstractContextManager[HistoryPages]:
        """The session's history before `reply_to`; raises `models.errors.NotAUserMessage` for a
        `reply_to` that is not a user message of the session."""
        ...

    def knowledge_bases(self, session_id: uuid.UUID) -> Sequence[str]:
        """Names of the knowledge bases attached to the session."""
        ...

    def searcher(self, session_id: uuid.UUID, knowledge_bases: Sequence[str]) -> KnowledgeSearch:
        """A search of these knowledge bases, within what the session may search."""
        ...

    def recorder(self) -> PaidCallRecorder:
        """The recorder of paid tool calls."""
        ...


def default_store() -> TurnStore:
    """chatq's Postgres store, for callers that hand none in."""
    # Imported on first use: `import handlers` must not need the database.
    from models.turn_store import PostgresTurnStore

    return PostgresTurnStore()

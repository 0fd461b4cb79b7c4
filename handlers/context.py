"""What a tool may need to know about the turn it runs in: session, knowledge bases, turn, call id.

Tools are plain functions called with the model's arguments, so the context travels beside the
arguments instead of through them:

- The worker says which turn and attempt it is running with `running_turn(turn_id, attempt)`
  around the handler call (optional: without it the turn is looked up when a paid call is recorded).
- A handler builds one `ToolContext` per invocation (`ToolContext.for_session`) and hands it to
  `run_tool(name, args, context=ctx.for_call(call_id))`, or sets it with `use_tool_context` around
  a framework's own tool execution; `run_tool` finds it through `current_tool_context()`.
- The store's side travels on it, injected when the invocation starts: the knowledge-base `search`
  bound to the session and the `recorder` of paid calls (`handlers.store`); so do the output limit
  and prices the calls run with (`settings`, the worker's `handlers.handler_settings.ToolSettings`).
- Tools read it with `current_tool_context()`; without one (a tool called outside a turn) they
  get None and must cope.

Context variables rather than globals: every thread and asyncio task sees only its own, and
`contextvars.copy_context()` (which LangChain uses to run tools) carries it along.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from handlers.approvals import ApprovalPolicy

if TYPE_CHECKING:
    from handlers.handler_settings import ToolSettings
    from handlers.journal import Journal, Resumed
    from handlers.store import KnowledgeSearch, PaidCallRecorder

__all__ = [
    "Retrieved",
    "ToolContext",
    "TurnRef",
    "current_tool_context",
    "current_turn",
    "running_turn",
    "use_tool_context",
]


@dataclass(frozen=True, kw_only=True)
class TurnRef:
    """The turn a handler invocation belongs to, as the worker knows it."""

    turn_id: uuid.UUID
    """The turn (= Celery task id)."""
    attempt: int | None = None
    """Which handler invocation of the turn this is (1 for the first, 2 for the retry)."""


_turn: ContextVar[TurnRef | None] = ContextVar("chatq_turn", default=None)
_tool: ContextVar[ToolContext | None] = ContextVar("chatq_tool_context", default=None)


@contextmanager
def running_turn(turn_id: uuid.UUID, attempt: int | None = None) -> Iterator[TurnRef]:
    """Mark the code inside as running turn `turn_id`, attempt `attempt` (the worker's side)."""
    ref = TurnRef(turn_id=turn_id, attempt=attempt)
    token = _turn.set(ref)
    try:
        yield ref
    finally:
        _turn.reset(token)


def current_turn() -> TurnRef | None:
    """The turn set by `running_turn`, if any."""
    return _turn.get()


class Retrieved:
    """Knowledge-base hits found during one invocation (thread-safe); citations are chosen from them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: list[dict[str, Any]] = []

    def add(self, hits: Sequence[dict[str, Any]]) -> None:
        """Remember hits (citation dicts: `document_id`, `title`, `chunk_id`, `snippet`)."""
        with self._lock:
            seen = {hit["chunk_id"] for hit in self._hits}
            for hit in hits:
                if hit["chunk_id"] not in seen:
                    seen.add(hit["chunk_id"])
                    self._hits.append(dict(hit))

    def hits(self) -> list[dict[str, Any]]:
        """Every distinct hit so far, in the order found."""
        with self._lock:
            return [dict(hit) for hit in self._hits]


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """One handler invocation as its tools see it; `for_call` adds the id of the call being run."""

    session_id: uuid.UUID | None
    """The chat session; None outside a session."""
    knowledge_bases: tuple[str, ...] = ()
    """Names of the knowledge bases attached to the session (empty: none; do not search)."""
    invocation_id: uuid.UUID = field(default_factory=uuid.uuid4)
    """This invocation (one attempt of a turn): with the call id, the idempotency key of paid calls."""
    turn: TurnRef | None = None
    """The turn and attempt, when the worker said (`running_turn`)."""
    tool_call_id: str | None = None
    """The id of the tool call being run (set by `for_call`)."""
    retrieved: Retrieved = field(default_factory=Retrieved)
    """Knowledge-base hits of this invocation, shared by every call's context."""
    search: KnowledgeSearch | None = None
    """`search(query, limit)` over `knowledge_bases`, bound to the session by the store (its own
    tenant's only); None: no search (the `search_knowledge_base` tool refuses)."""
    recorder: PaidCallRecorder | None = None
    """Where paid tool calls are recorded (`handlers.accounting`); None: the default store's."""
    journal: Journal | None = None
    """Where `run_tool` records each call's start and result (`handlers.journal`); None: nothing is recorded."""
    resumed: Resumed | None = None
    """The earlier attempts' finished steps: `run_tool` answers a call of the open round from them."""
    settings: ToolSettings | None = None
    """The tool output limit and the prices the calls run with, handed in by `build_turn_input`
    (the worker's); None, for a context built by hand outside a turn: this process's."""
    approval: ApprovalPolicy | None = None
    """Which calls need a person's approval besides those of tools that ask for it (`handlers.approvals`):
    the session's `approval`; None: only those."""

    @property
    def idempotency_key(self) -> str | None:
        """`"{turn_id}:{call_id}"` for the call being run: the same in every attempt of the turn, so a
        tool can pass it to the service it calls and a repeated call is recognised there. None
        outside a turn or a call."""
        if self.turn is None or self.tool_call_id is None:
            return None
        return f"{self.turn.turn_id}:{self.tool_call_id}"

    @classmethod
    def for_session(
        cls,
        session: Any,
        *,
        knowledge_bases: Sequence[str] = (),
        search: KnowledgeSearch | None = None,
        recorder: PaidCallRecorder | None = None,
        settings: ToolSettings | None = None,
    ) -> ToolContext:
        """A fresh context for one invocation on `session` (anything with an `id`)."""
        raw = getattr(session, "id", None)
        try:
            session_id = raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw)) if raw is not None else None
        except ValueError:
            session_id = None
        return cls(
            session_id=session_id,
            knowledge_bases=tuple(knowledge_bases),
            turn=current_turn(),
            search=search,
            recorder=recorder,
            settings=settings,
            approval=ApprovalPolicy.of((getattr(session, "metadata_", None) or {}).get("approval")),
        )

    def for_call(self, tool_call_id: str) -> ToolContext:
        """The same invocation, running the call `tool_call_id`."""
        return replace(self, tool_call_id=tool_call_id)


@contextmanager
def use_tool_context(context: ToolContext | None) -> Iterator[ToolContext | None]:
    """Make `context` the current tool context inside the block (None leaves it as it is)."""
    if context is None:
        yield _tool.get()
        return
    token = _tool.set(context)
    try:
        yield context
    finally:
        _tool.reset(token)


def current_tool_context() -> ToolContext | None:
    """The context of the tool call being run, if any."""
    return _tool.get()

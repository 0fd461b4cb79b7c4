"""handlers/ on its data handed in: the pure history trimming, and a turn prepared from a store.

The store here is an in-memory `handlers.store.TurnStore`: these tests are about what handlers/
does with what it is given (the Postgres store is tested against Postgres in
tests/integration/handlers and tests/integration/knowledge).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from chatq.settings import Settings
from handlers.accounting import record_tool_call
from handlers.context import ToolContext, use_tool_context
from handlers.errors import HandlerError
from handlers.handler_settings import HandlerSettings
from handlers.history import trim_history
from handlers.messages import SessionInfo
from handlers.tokens import count_message_tokens, count_tokens
from handlers.tools import KNOWLEDGE_BASE_TOOL, run_tool
from handlers.turn_input import build_turn_input
from models.errors import NotAUserMessage


@dataclass(frozen=True, kw_only=True)
class Row:
    position: int
    turn_id: int
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Earlier:
    messages: int
    turns: int
    snippets: tuple[str, ...]


class Pages:
    """Rows of `turns` exchanges (a user message and a reply each), read as the store reads them."""

    def __init__(self, turns: int) -> None:
        self.rows = [
            Row(position=turn * 10 + offset, turn_id=turn, role=role, content=f"{role} {turn}: about number {turn}")
            for turn in range(turns)
            for offset, role in enumerate(("user", "assistant"))
        ]
        self.asked: list[tuple[int | None, int]] = []
        self.earlier_asked: list[int | None] = []

    def page(self, cursor: int | None, limit: int) -> list[Row]:
        self.asked.append((cursor, limit))
        below = [row for row in self.rows if cursor is None or row.position < cursor]
        return below[::-1][:limit]

    def earlier(self, boundary: int | None) -> Earlier:
        self.earlier_asked.append(boundary)
        before = [row for row in self.rows if boundary is None or row.position < boundary]
        firsts = tuple(str(row.content) for row in before if row.role == "user")[:2]
        return Earlier(messages=len(before), turns=len({row.turn_id for row in before}), snippets=firsts)


def _cost(rows: Sequence[Row]) -> int:
    return sum(
        count_message_tokens({"role": r.role, "content": r.content, "tool_calls": None, "tool_call_id": None})
        for r in rows
    )


def test_trimming_keeps_whole_turns_newest_first_and_summarises_the_rest() -> None:
    pages = Pages(turns=5)
    budget = _cost(pages.rows[-4:])  # room for exactly the last two turns
    history = trim_history(pages, budget_tokens=budget)
    assert [m["content"] for m in history.messages] == [r.content for r in pages.rows[-4:]]
    assert history.tokens == budget
    assert history.omitted == 6
    assert history.summary is not None
    assert history.summary.startswith("6 earlier messages from 3 turns omitted")
    assert '"user 0: about number 0"' in history.summary
    # One short page held everything; the store is asked what lies below the oldest kept message.
    assert pages.asked == [(None, 16)]
    assert pages.earlier_asked == [30]
    # One token short of the last turn: the whole turn goes, not just its older message.
    assert trim_history(Pages(turns=5), budget_tokens=_cost(pages.rows[-2:]) - 1).messages == []


def test_trimming_reads_only_the_pages_the_budget_needs() -> None:
    pages = Pages(turns=500)
    history = trim_history(pages, budget_tokens=_cost(pages.rows[-40:]))
    assert len(history.messages) == 40
    assert sum(limit for _, limit in pages.asked) < 200  # of 1,000 rows
    complete = Pages(turns=3)
    assert len(trim_history(complete, budget_tokens=10_000).messages) == 6
    assert complete.earlier_asked == []  # nothing left out: no question about it


@dataclass
class Store:
    """An in-memory TurnStore: what it handed out, and what was recorded through it."""

    knowledge: tuple[str, ...] = ("handbook",)
    history_error: Exception | None = None
    recorded: list[dict[str, Any]] = field(default_factory=list)
    searched: list[tuple[uuid.UUID, tuple[str, ...], str, int]] = field(default_factory=list)
    pages: Pages = field(default_factory=lambda: Pages(turns=2))

    @contextmanager
    def history(self, session_id: uuid.UUID, reply_to: int | None) -> Iterator[Pages]:
        if self.history_error is not None:
            raise self.history_error
        yield self.pages

    def knowledge_bases(self, session_id: uuid.UUID) -> tuple[str, ...]:
        return self.knowledge

    def searcher(self, session_id: uuid.UUID, knowledge_bases: Sequence[str]) -> Any:
        def search(query: str, limit: int) -> list[Any]:
            self.searched.append((session_id, tuple(knowledge_bases), query, limit))
            return []

        return search

    def recorder(self) -> Any:
        def record(**call: Any) -> bool:
            fresh = all(c["tool_call_id"] != call["tool_call_id"] for c in self.recorded)
            self.recorded.append(call)
            return fresh

        return record


SETTINGS = HandlerSettings()
"""Handed to every turn built here: chatq's defaults, whatever this process's environment says."""


def _session() -> SessionInfo:
    return SessionInfo(id=uuid.uuid4(), agent_framework="none", model="echo", knowledge_bases=None)


def test_a_turn_is_prepared_from_the_store_it_is_handed(chatq_env: dict[str, str]) -> None:
    store, session = Store(), _session()
    turn = build_turn_input(session, "refunds?", settings=SETTINGS, store=store)
    assert [m["content"] for m in turn.history] == [r.content for r in store.pages.rows]
    assert turn.knowledge_bases == ("handbook",)
    # The first search went through the store's search, bound to the session, and was recorded by its recorder.
    assert store.searched == [(session.id, ("handbook",), "refunds?", 5)]
    assert [(c["tool_name"], c["session_id"], c["unit_price"]) for c in store.recorded] == [
        (KNOWLEDGE_BASE_TOOL, session.id, Decimal(0))
    ]
    assert turn.tool_context.search is not None and turn.tool_context.recorder is not None


def test_a_turn_is_prepared_with_the_settings_it_is_handed(chatq_env: dict[str, str]) -> None:
    """Not the process's: every value handlers/ uses comes from the `HandlerSettings` handed in."""
    handed = HandlerSettings.of(
        Settings(
            default_model="llama3",
            openai_base_url="http://models.invalid/v1",
            turn_timeout=7.5,
            history_tokens=_cost(Pages(turns=2).rows[-2:]) + count_tokens("refunds?"),
            vision_models=("llama3",),
            max_tool_output_chars=321,
            prices='{"tools": {"search_knowledge_base": 0.25}}',
        )
    )
    store = Store()
    session = SessionInfo(id=uuid.uuid4(), agent_framework="none", model=None, knowledge_bases=None)
    turn = build_turn_input(session, "refunds?", images=["https://x/y.png"], settings=handed, store=store)
    assert turn.model == "llama3"  # the session names none: the handed-in default
    assert turn.deadline.seconds == turn.timeout == 7.5
    assert turn.endpoint == handed.endpoint and turn.endpoint.base_url == "http://models.invalid/v1"
    assert len(turn.history) == 2 and turn.history_omitted == 2  # the budget held the last turn only
    assert isinstance(turn.user_content, list)  # llama3 takes images here, by the vision models handed in
    assert turn.tool_context.settings == handed.tools
    # The first search was priced by the prices handed in.
    assert [c["unit_price"] for c in store.recorded] == [Decimal("0.25")]
    with_defaults = build_turn_input(session, "refunds?", images=["https://x/y.png"], settings=SETTINGS, store=Store())
    assert with_defaults.model == "echo" and isinstance(with_defaults.user_content, list)
    assert len(with_defaults.history) == 4 and with_defaults.deadline.seconds == SETTINGS.turn_timeout


def test_the_stores_errors_reach_the_caller_unchanged(chatq_env: dict[str, str]) -> None:
    class Outage(Exception):
        pass

    with pytest.raises(Outage):
        build_turn_input(_session(), "hi", settings=SETTINGS, store=Store(history_error=Outage("connection refused")))
    # A reply_to the store cannot place is bad input, as the contract says: a HandlerError.
    refused = Store(history_error=NotAUserMessage("reply_to 7 is not a user message of this session"))
    with pytest.raises(HandlerError, match="reply_to 7 is not a user message"):
        build_turn_input(_session(), "hi", reply_to=7, settings=SETTINGS, store=refused)


def test_paid_calls_and_searches_go_through_the_tool_context(chatq_env: dict[str, str]) -> None:
    store, session_id = Store(), uuid.uuid4()
    context = ToolContext(
        session_id=session_id,
        knowledge_bases=("handbook",),
        search=store.searcher(session_id, ("handbook",)),
        recorder=store.recorder(),
    )
    output = run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refunds", "limit": 50}, context=context.for_call("c1"))
    assert output == 'No passage of the knowledge base matches "refunds".'
    assert store.searched == [(session_id, ("handbook",), "refunds", 10)]  # the limit is capped
    assert [c["tool_call_id"] for c in store.recorded] == ["c1"]
    # A framework that runs paid tools itself records through the same recorder.
    with use_tool_context(context):
        assert record_tool_call(tool_name="demo", tool_call_id="c2", invocation_id=uuid.uuid4(), unit_price=0.5)
    assert store.recorded[-1]["unit_price"] == Decimal("0.5")

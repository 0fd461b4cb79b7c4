"""Sessions with knowledge bases, for every framework: search first, cite, record the paid search.

Real handlers over HTTP to the OpenAI stub, real Postgres full-text search, no mocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from handlers import AgentMessage, framework_names, get_agent_handler
from handlers.accounting import record_tool_call
from handlers.base import SessionInfo
from handlers.context import ToolContext, running_turn
from handlers.handler_settings import ToolSettings
from handlers.knowledge import start_invocation
from handlers.tools import KNOWLEDGE_BASE_TOOL, UNRECORDED, Tool, register_tool, run_tool, unregister_tool
from models.db import session_scope
from models.knowledge import attach_knowledge_bases
from models.tables import PaidToolCall, TurnStatus
from models.turn_store import PostgresTurnStore
from tests.support.env import environ
from tests.support.factories import add_turn, user
from tests.support.handlers import stream_turn
from tests.support.knowledge import Corpus, make_corpus
from tests.support.openai_stub import OpenAIStub

MakeSession = Callable[..., SessionInfo]
TOOL_FRAMEWORKS = [f for f in framework_names() if f != "none"]
"""Frameworks whose model can call tools (`none` makes one plain model call)."""


@pytest.fixture
def corpus(tmp_path: Path, chatq_env: dict[str, str]) -> Corpus:
    return make_corpus(tmp_path)


def _kb_session(make_session: MakeSession, corpus: Corpus, framework: str) -> SessionInfo:
    session = make_session(framework=framework)
    attach_knowledge_bases(session.id, [corpus.name])
    return session


def _paid_calls(session_id: Any) -> list[PaidToolCall]:
    with session_scope() as db:
        return list(
            db.execute(select(PaidToolCall).where(PaidToolCall.session_id == session_id).order_by(PaidToolCall.id))
            .scalars()
            .all()
        )


def _tools_bound(request: dict[str, Any]) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools") or ()}


@pytest.mark.parametrize("framework", framework_names())
def test_the_first_model_request_already_holds_the_search_result(
    stub_env: OpenAIStub, make_session: MakeSession, corpus: Corpus, framework: str
) -> None:
    session = _kb_session(make_session, corpus, framework)
    messages, _ = get_agent_handler(session).invoke("How long do refunds take?")

    first = stub_env.requests[0]["messages"]
    system = first[0]["content"]
    assert first[0]["role"] == "system" and corpus.name in system
    if framework == "none":
        # No tools here: the handler searched itself and the results close the system prompt.
        assert "already been searched" in system
        assert "Refund policy (document" in system and "within 14 days" in system
        assert first[-1] == {"role": "user", "content": "How long do refunds take?"}
    else:
        assert "search the knowledge base first" in system
        call, result = first[-2], first[-1]
        assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == KNOWLEDGE_BASE_TOOL
        assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
        assert "Refund policy (document" in result["content"] and "within 14 days" in result["content"]
        assert first[-3] == {"role": "user", "content": "How long do refunds take?"}
        assert KNOWLEDGE_BASE_TOOL in _tools_bound(stub_env.requests[0])
        assert [m.role for m in messages] == ["assistant", "tool", "assistant"]
        assert messages[0].tool_calls == [
            {"id": result["tool_call_id"], "name": KNOWLEDGE_BASE_TOOL, "args": {"query": "How long do refunds take?"}}
        ]
    assert len(stub_env.requests) == 1
    (paid,) = _paid_calls(session.id)  # the retrieval is a paid call like any other
    assert paid.tool_name == KNOWLEDGE_BASE_TOOL and paid.units == 1


@pytest.mark.parametrize("framework", framework_names())
def test_the_reply_cites_the_documents_it_names(
    stub_env: OpenAIStub, make_session: MakeSession, corpus: Corpus, framework: str
) -> None:
    session = _kb_session(make_session, corpus, framework)
    # The search finds the refund policy (both chunks) and the warranty; the answer names one document.
    message = "damaged goods refund? [answer: Per the Refund policy: full price back.]"
    events = list(stream_turn(get_agent_handler(session), message))
    final = events[-1]
    assert final.kind == "final"
    reply: AgentMessage = final.response[-1]
    assert reply.content == "Per the Refund policy: full price back."
    assert reply.citations is not None
    assert {c["document_id"] for c in reply.citations} == {corpus.documents["Refund policy"]}
    assert {c["title"] for c in reply.citations} == {"Refund policy"}
    assert len(reply.citations) == 2  # both chunks of that document were found
    first = reply.citations[0]
    assert set(first) == {"document_id", "title", "chunk_id", "snippet"}
    assert "**Damaged**" in first["snippet"] and "**refund**" in first["snippet"]
    assert reply.to_dict()["citations"] == reply.citations
    assert AgentMessage.from_dict(reply.to_dict()) == reply
    # Only the final answer carries citations.
    assert all(m.citations is None for m in final.response[:-1])
    tools = [e.tool for e in events if e.kind == "tool"]
    assert [(t["name"], t["status"]) for t in tools][:2] == [
        (KNOWLEDGE_BASE_TOOL, "started"),
        (KNOWLEDGE_BASE_TOOL, "finished"),
    ]
    assert events.index(next(e for e in events if e.kind == "tool")) < events.index(
        next(e for e in events if e.kind == "text")
    )


@pytest.mark.parametrize("framework", framework_names())
def test_an_answer_naming_no_document_cites_what_was_found(
    stub_env: OpenAIStub, make_session: MakeSession, corpus: Corpus, framework: str
) -> None:
    session = _kb_session(make_session, corpus, framework)
    messages, _ = get_agent_handler(session).invoke("express shipping")
    citations = messages[-1].citations or []
    assert [c["document_id"] for c in citations] == [
        corpus.documents["Shipping times"],
        corpus.documents["Refund policy"],
    ]


@pytest.mark.parametrize("framework", TOOL_FRAMEWORKS)
def test_the_model_can_search_again_and_both_searches_are_recorded(
    stub_env: OpenAIStub, make_session: MakeSession, corpus: Corpus, framework: str
) -> None:
    session = _kb_session(make_session, corpus, framework)
    prices = '{"tools": {"search_knowledge_base": 0.002}}'
    with environ(CHATQ_PRICES=prices):
        messages, _ = get_agent_handler(session).invoke(
            f'what about plants? [tool: {KNOWLEDGE_BASE_TOOL} {{"query": "ficus water"}}]'
        )
    assert [m.role for m in messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert "Office plants (document" in messages[3].content
    assert messages[-1].content.startswith("The answer is 1 passage from the knowledge base")
    assert [c["title"] for c in messages[-1].citations or []] == ["Office plants"]
    paid = _paid_calls(session.id)
    assert [p.tool_call_id for p in paid] == [messages[0].tool_calls[0]["id"], messages[2].tool_calls[0]["id"]]
    assert len({p.invocation_id for p in paid}) == 1  # one invocation, two real calls
    assert [p.cost for p in paid] == [Decimal("0.002"), Decimal("0.002")]


@pytest.mark.parametrize("framework", framework_names())
def test_a_session_without_knowledge_bases_never_searches(
    stub_env: OpenAIStub, make_session: MakeSession, chatq_env: dict[str, str], framework: str
) -> None:
    session = make_session(framework=framework)
    handler = get_agent_handler(session)
    messages, _ = handler.invoke("How long do refunds take?")
    assert [m.role for m in messages] == ["assistant"] and messages[0].citations is None
    request = stub_env.requests[0]
    assert KNOWLEDGE_BASE_TOOL not in _tools_bound(request)
    assert "do not call the search tool" in request["messages"][0]["content"]
    assert not any(m["role"] == "tool" for m in request["messages"])
    if framework in TOOL_FRAMEWORKS:
        # A model that calls it anyway gets an error result: the tool is not there.
        messages, _ = handler.invoke(f'refunds? [tool: {KNOWLEDGE_BASE_TOOL} {{"query": "refunds"}}]')
        assert messages[1].role == "tool" and messages[1].content.startswith("Error: unknown tool")
        assert all(KNOWLEDGE_BASE_TOOL not in _tools_bound(r) for r in stub_env.requests)
    assert _paid_calls(session.id) == []


def test_listing_the_tool_in_metadata_does_not_bind_it_without_knowledge_bases(
    stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    session = make_session(metadata={"tools": ["calculator", KNOWLEDGE_BASE_TOOL]})
    get_agent_handler(session).invoke("hello")
    assert _tools_bound(stub_env.requests[0]) == {"calculator"}


def test_a_paid_call_is_recorded_once(make_session: MakeSession, corpus: Corpus) -> None:
    session = _kb_session(make_session, corpus, "langgraph")
    context = start_invocation(session, PostgresTurnStore(), ToolSettings())
    call = context.for_call("call-1")
    assert "Refund policy" in run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=call)
    assert "Refund policy" in run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=call)  # replayed
    assert run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=context.for_call("call-2"))
    assert [p.tool_call_id for p in _paid_calls(session.id)] == ["call-1", "call-2"]
    # The same call in a new invocation (a retried attempt) really ran again: a new record.
    again = start_invocation(session, PostgresTurnStore(), ToolSettings()).for_call("call-1")
    run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=again)
    assert len(_paid_calls(session.id)) == 3
    # record_tool_call itself is idempotent on (invocation, call).
    kwargs: dict[str, Any] = {
        "tool_name": "demo",
        "tool_call_id": "x",
        "invocation_id": uuid.uuid4(),
        "session_id": session.id,
        "units": 3,
        "unit_price": 0.5,
    }
    assert record_tool_call(**kwargs) is True
    assert record_tool_call(**kwargs) is False
    demo = [p for p in _paid_calls(session.id) if p.tool_name == "demo"]
    assert [(p.units, p.unit_price, p.cost) for p in demo] == [(3, Decimal("0.5"), Decimal("1.5"))]


def test_paid_calls_belong_to_the_running_turn(make_session: MakeSession, corpus: Corpus) -> None:
    session = _kb_session(make_session, corpus, "langgraph")
    running = add_turn(session.id, [user("question")], status=TurnStatus.RUNNING)
    with session_scope() as db:
        from models.tables import Turn

        db.get_one(Turn, running.id).attempts = 2
    # Without the worker saying which turn runs, the session's running turn is taken.
    context = start_invocation(session, PostgresTurnStore(), ToolSettings())
    run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=context.for_call("a"))
    # With it, what the worker said.
    other_turn = add_turn(session.id, [user("earlier")], status=TurnStatus.SUCCEEDED)
    with running_turn(other_turn.id, 1):
        told = start_invocation(session, PostgresTurnStore(), ToolSettings())
    run_tool(KNOWLEDGE_BASE_TOOL, {"query": "refund"}, context=told.for_call("b"))
    paid = {p.tool_call_id: p for p in _paid_calls(session.id)}
    assert (paid["a"].turn_id, paid["a"].attempt) == (running.id, 2)
    assert (paid["b"].turn_id, paid["b"].attempt) == (other_turn.id, 1)


def test_a_paid_call_that_cannot_be_recorded_does_not_run(
    chatq_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []
    register_tool(Tool(name="paid_probe_test", description="probe", func=lambda: ran.append("x") or "ok", paid=True))
    try:
        unknown_session = ToolContext(session_id=uuid.uuid4()).for_call("c")  # no such session: the insert fails
        assert run_tool("paid_probe_test", {}, context=unknown_session) == UNRECORDED
        with environ(CHATQ_PRICES="{broken"):
            assert run_tool("paid_probe_test", {}, context=unknown_session) == UNRECORDED
        assert ran == []
        assert "recording the call failed" in caplog.text
        assert run_tool("paid_probe_test", {}) == "ok"  # outside a turn: nothing to bill, it runs
    finally:
        unregister_tool("paid_probe_test")

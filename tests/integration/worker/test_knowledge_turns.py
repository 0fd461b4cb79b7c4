"""Knowledge-base sessions: citations in the final event, paid searches recorded once per call.

The turns run in this process (`in_process`) but in the last test, the real-worker case of knowledge
turns, whose retry goes through Celery's (a worker process re-delivers the task after its countdown).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from handlers.tools import KNOWLEDGE_BASE_TOOL
from models.db import session_scope
from models.knowledge import attach_knowledge_bases
from models.tables import PaidToolCall
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.inprocess import InProcessWorker
from tests.support.knowledge import Corpus, make_corpus
from tests.support.turns import replay_events, turn_messages, wait_for_turn
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn
from worker.queries import usage_report


@pytest.fixture
def corpus(tmp_path: Path, chatq_env: dict[str, str]) -> Corpus:
    return make_corpus(tmp_path)


def _kb_session(corpus: Corpus) -> uuid.UUID:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    attach_knowledge_bases(session_id, [corpus.name])
    return session_id


def _paid(turn_id: uuid.UUID) -> list[PaidToolCall]:
    with session_scope() as db:
        return list(
            db.execute(select(PaidToolCall).where(PaidToolCall.turn_id == turn_id).order_by(PaidToolCall.id)).scalars()
        )


def test_the_stored_reply_keeps_its_citations(in_process: InProcessWorker, corpus: Corpus) -> None:
    session_id = _kb_session(corpus)
    turn = submit_turn(session_id, "express shipping [answer: Shipping times says one day.]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    reply = turn_messages(turn.turn_id)[-1]
    assert reply.citations is not None
    assert [c["title"] for c in reply.citations] == ["Shipping times"]


def test_a_session_without_knowledge_bases_records_no_search(in_process: InProcessWorker) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, "How long do refunds take?")
    assert wait_for_turn(turn.turn_id).status.value == "succeeded"
    assert [m.role for m in turn_messages(turn.turn_id)] == ["user", "assistant"]
    assert _paid(turn.turn_id) == []
    assert usage_report(session_id)["tool_calls"] == 0


# The real-worker case of knowledge turns.
@pytest.mark.slow
def test_a_retried_turn_records_each_real_search_once(worker: WorkerProcess, redis_url: str, corpus: Corpus) -> None:
    session_id = _kb_session(corpus)
    key = uuid.uuid4().hex
    # Attempt 1 searches, then the model fails; attempt 2 resumes after the journaled search
    # (durable steps) and answers: one real search, paid once.
    turn = submit_turn(session_id, f"How long do refunds take? [fail-once: {key}] [answer: Per the Refund policy.]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded", row.error
    assert row.attempts == 2

    paid = _paid(turn.turn_id)
    assert [(p.tool_name, p.attempt, p.session_id) for p in paid] == [(KNOWLEDGE_BASE_TOOL, 1, session_id)]

    # The stored turn is the successful attempt's: the search, its result and the answer, once.
    stored = turn_messages(turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls[0]["name"] == KNOWLEDGE_BASE_TOOL
    assert stored[2].tool_call_id == stored[1].tool_calls[0]["id"] == paid[0].tool_call_id
    assert "within 14 days" in stored[2].content

    events = replay_events(redis_url, turn.turn_id)
    final = events[-1]
    assert final["type"] == "final"
    citations = final["messages"][-1]["citations"]
    assert {c["document_id"] for c in citations} == {corpus.documents["Refund policy"]}
    assert all(set(c) == {"document_id", "title", "chunk_id", "snippet"} for c in citations)
    assert all(m["citations"] is None for m in final["messages"][:-1])
    tool_events = [(e["tool"]["name"], e["tool"]["status"], e["attempt"]) for e in events if e["type"] == "tool"]
    # The resumed attempt does not stream the finished search again.
    assert tool_events == [(KNOWLEDGE_BASE_TOOL, "started", 1), (KNOWLEDGE_BASE_TOOL, "finished", 1)]

    report = usage_report(session_id)
    assert report["tool_calls"] == 1
    assert report["by_tool"] == [{"tool": KNOWLEDGE_BASE_TOOL, "calls": 1, "units": 1, "cost": 0.0}]
    assert report["turns"] == 1 and report["total_tokens"] == row.total_tokens

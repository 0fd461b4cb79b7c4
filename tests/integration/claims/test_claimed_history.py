"""The history rows the claim reads (`Claim.history_head`) and the store that starts from them
(`worker.runtime.delivery.claimed_store`) against the real Postgres: the same history as the
store's own reads, whatever the budget, with one round trip less."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import event, select

from chatq.settings import get_settings
from handlers.base import AgentMessage
from handlers.history import trim_history
from models.db import get_engine, session_scope
from models.tables import ChatMessage
from models.turn_store import PostgresTurnStore
from worker.producer import create_session, submit_turn
from worker.runtime.delivery.claimed_store import ClaimedTurnStore
from worker.store.claims import Claim, claim_turn, complete_turn
from worker.store.transition_sql import HISTORY_HEAD

pytestmark = pytest.mark.usefixtures("chatq_env")


def _claim(session_id: uuid.UUID, text: str, reply_to: int | None = None) -> Claim:
    turn_id = submit_turn(session_id, text, reply_to=reply_to).turn_id
    claimed = claim_turn(turn_id, worker="w", engine=get_engine(), settings=get_settings()).claim
    assert claimed is not None
    return claimed


def _answer(claim: Claim, text: str) -> None:
    reply = [AgentMessage(role="assistant", content=text)]
    assert complete_turn(claim, reply, {"total_tokens": 1}, engine=get_engine()).stored


def _statements() -> list[str]:
    seen: list[str] = []
    event.listen(get_engine(), "before_cursor_execute", lambda *args, **_: seen.append(args[2]))
    return seen


def test_a_first_turn_has_an_empty_history_and_reads_nothing_more() -> None:
    claim = _claim(create_session(framework="none", model="echo"), "hello")
    assert claim.history_head == ()
    seen = _statements()
    with ClaimedTurnStore(claim).history(claim.session.id, None) as pages:
        history = trim_history(pages, "hello", budget_tokens=1000)
    assert history.messages == [] and history.omitted == 0
    assert seen == []


@pytest.mark.parametrize("budget", [30, 200, 100_000])
def test_the_claims_history_is_the_stores_whatever_the_budget(budget: int) -> None:
    session_id = create_session(framework="none", model="echo")
    for index in range(HISTORY_HEAD):  # twice the head's rows: later pages come from Postgres
        _answer(_claim(session_id, f"question {index} " + "word " * index), f"answer {index} " + "more " * index)
    claim = _claim(session_id, "and now?")
    assert claim.history_head is not None and len(claim.history_head) == HISTORY_HEAD
    with PostgresTurnStore().history(session_id, None) as pages:
        assert list(claim.history_head) == pages.page(None, HISTORY_HEAD)
        expected = trim_history(pages, "and now?", budget_tokens=budget)
    with ClaimedTurnStore(claim).history(session_id, None) as pages:
        assert trim_history(pages, "and now?", budget_tokens=budget) == expected


def test_a_reply_to_turn_reads_its_history_from_the_store() -> None:
    session_id = create_session(framework="none", model="echo")
    first = _claim(session_id, "first")
    _answer(first, "one")
    _answer(_claim(session_id, "second"), "two")
    with session_scope() as db:  # the user message's id: reply_to names it (regenerate)
        message_id = db.execute(
            select(ChatMessage.id).where(ChatMessage.turn_id == first.turn_id, ChatMessage.role == "user")
        ).scalar_one()
    claim = _claim(session_id, "first, again", reply_to=message_id)
    assert claim.history_head is None
    with ClaimedTurnStore(claim).history(session_id, message_id) as pages:
        assert pages.page(None, 10) == []

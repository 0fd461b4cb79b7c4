"""Deleting a session: its turns stop first, and nothing of it is left anywhere.

The turns run in this process (`in_process`) but in the first test, the real-worker case of
deletion: a worker process running the session's turn learns of the delete and stops.

"Nothing left" is checked by scanning every table's rows and every Redis key and value (task
messages' bodies decoded) for the session's id and its turns' ids.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest

from handlers.accounting import record_tool_call
from tests.integration.sessions.conftest import STUB_MODEL
from tests.support.broker import wait_for_drained_queues, wait_until
from tests.support.inprocess import InProcessWorker
from tests.support.scan import redis_mentioning, tables_mentioning
from tests.support.turns import replay_events, wait_for_status
from tests.support.workers import WorkerProcess
from worker.dispatch import send_turn
from worker.errors import SessionNotFound, TurnNotFound, WaitTimeout
from worker.events import get_redis
from worker.payload import task_message
from worker.producer import create_session, delete_session, get_session, submit_turn, wait_for_turn
from worker.queries import usage_report


def _totals(report: dict[str, Any]) -> tuple[Any, ...]:
    return (report["turns"], report["total_tokens"], report["tool_calls"], report["tool_cost"])


def _nothing_left(redis_url: str, ids: list[str]) -> None:
    assert tables_mentioning(ids) == {}
    # A worker that was mid-reply may still be finding out (within a lease renewal): wait for it.
    wait_until("no Redis key or value names the session", lambda: redis_mentioning(redis_url, ids) == [])


def _running_with_text(redis_url: str, turn_id: uuid.UUID) -> None:
    wait_for_status(turn_id, "running")
    wait_until("the turn streams", lambda: any(e["type"] == "text" for e in replay_events(redis_url, turn_id)))


# The real-worker case of deletion.
@pytest.mark.slow
def test_delete_stops_the_turns_and_leaves_no_row_key_or_stream(worker: WorkerProcess, redis_url: str) -> None:
    sid = create_session(framework="langgraph", model=STUB_MODEL, metadata={"user": "to-forget"})
    done = submit_turn(sid, "six times seven [calc: 6*7]")
    stored = wait_for_turn(done.turn_id, timeout=60)
    assert stored["status"] == "succeeded" and stored["messages"][-1]["content"] == "The answer is 42."
    record_tool_call(
        tool_name="web_search",
        tool_call_id="call-1",
        invocation_id=uuid.uuid4(),
        session_id=sid,
        turn_id=done.turn_id,
        unit_price=Decimal("0.01"),
    )
    running = submit_turn(sid, "long [words: 400] [slow: 0.05]")
    _running_with_text(redis_url, running.turn_id)
    queued = submit_turn(sid, "waits behind the long one")
    before = usage_report()

    report = delete_session(sid)

    assert report.turns == 3 and set(report.stopped) == {running.turn_id, queued.turn_id}
    wait_for_drained_queues(redis_url)
    ids = [str(sid), str(done.turn_id), str(running.turn_id), str(queued.turn_id)]
    _nothing_left(redis_url, ids)
    # What billing needs is kept, aggregated, without content: the totals do not change.
    assert _totals(usage_report()) == _totals(before)
    with pytest.raises(SessionNotFound):
        get_session(sid)
    with pytest.raises(SessionNotFound):
        submit_turn(sid, "too late")
    with pytest.raises(SessionNotFound):
        delete_session(sid)
    assert worker.alive and "Traceback" not in worker.log()


def test_a_message_of_a_deleted_session_does_not_bring_it_back(in_process: InProcessWorker, redis_url: str) -> None:
    sid = create_session(framework="none", model="echo")
    delete_session(sid)
    ghost = uuid.uuid4()
    # As a producer that stored nothing would send it (or one left in Redis when the session went).
    assert send_turn(
        task_message(turn_id=ghost, session_id=sid, content="ghost", images=None, reply_to=None),
        queue="chatq",
        client=get_redis(),
    )
    in_process.wait_idle()
    wait_until(
        "the runtime drops it", lambda: f"turn {ghost} session {sid}: the session was deleted" in in_process.log()
    )
    _nothing_left(redis_url, [str(sid), str(ghost)])


def test_a_turn_whose_rows_go_while_it_runs_stores_nothing_and_leaves_no_stream(
    in_process: InProcessWorker, redis_url: str
) -> None:
    sid = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(sid, "long [words: 400] [slow: 0.05]")
    _running_with_text(redis_url, turn.turn_id)
    delete_session(sid, stop_wait=0)  # the rows go before the runtime has seen the cancel
    in_process.wait_idle()
    _nothing_left(redis_url, [str(sid), str(turn.turn_id)])
    assert not in_process.errors and "Traceback" not in in_process.log()


def test_wait_for_turn_returns_the_stored_turn_when_it_ends(in_process: InProcessWorker) -> None:
    sid = create_session(framework="none", model=STUB_MODEL, tenant="acme")
    turn = submit_turn(sid, "hello [words: 3]")
    stored = wait_for_turn(turn.turn_id, timeout=60, tenant="acme")
    assert stored["status"] == "succeeded" and stored["messages"][-1]["content"] == "w1 w2 w3"
    assert wait_for_turn(turn.turn_id, timeout=0.01) == stored, "an ended turn is returned at once"
    with pytest.raises(TurnNotFound):
        wait_for_turn(turn.turn_id, timeout=1, tenant="globex")
    slow = submit_turn(sid, "slow [sleep: 3]")
    with pytest.raises(WaitTimeout, match=r"did not end within 0\.3 s"):
        wait_for_turn(slow.turn_id, timeout=0.3)
    assert wait_for_turn(slow.turn_id, timeout=60)["status"] == "succeeded"

"""Nothing is left behind or let out: secrets a model server echoes, sent-markers of finished turns."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis

from models.db import autocommit_scope
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.turns import replay_events, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.dispatch import send_turns
from worker.events import get_redis
from worker.markers import sent_marker
from worker.payload import TurnRequest
from worker.producer import create_session, submit_turn
from worker.store.claims import insert_turn

pytestmark = pytest.mark.slow


def test_an_api_key_echoed_by_the_model_server_stays_out_of_logs_and_events(
    worker: WorkerProcess, worker_env: dict[str, str], redis_url: str
) -> None:
    key = worker_env["OPENAI_API_KEY"]
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, "who am I [unauthorized]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "failed" and row.error and "401" in row.error
    events = replay_events(redis_url, turn.turn_id)
    assert events[-1]["type"] == "error"
    assert key not in json.dumps(events)
    deadline = time.monotonic() + 10
    while f"turn {turn.turn_id} session {session_id}: failed" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = worker.log()
    assert "Incorrect API key provided: ***" in log  # the server's message was logged, masked
    assert key not in log


def test_finished_turns_leave_no_sent_marker_behind(worker: WorkerProcess, redis_url: str) -> None:
    # Many messages in one send: the worker takes the first ones while the rest are still going out,
    # which is when a marker written after its message's send outlived the turn (for 24 hours).
    requests = []
    with autocommit_scope() as conn:
        for _ in range(150):
            request = TurnRequest(
                turn_id=uuid.uuid4(), session_id=create_session(framework="none", model="echo"), content="hi"
            )
            insert_turn(conn, request, queue="chatq")
            requests.append(request)
    assert send_turns([r.to_message() for r in requests], queue="chatq", client=get_redis()) == len(requests)
    rows = wait_for_turns([r.turn_id for r in requests], timeout=120)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    client = redis.Redis.from_url(redis_url)
    try:
        left = [r.turn_id for r in requests if client.exists(sent_marker(r.turn_id))]
    finally:
        client.close()
    assert left == [], f"{len(left)} finished turns kept their sent-marker"

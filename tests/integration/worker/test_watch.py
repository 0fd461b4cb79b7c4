"""`chatq watch` of things that do not exist, of a turn that exists but has no events yet, and of one
whose terminal event never came."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from chatq.settings import get_settings
from handlers.messages import AgentMessage
from models.db import autocommit_scope, get_engine
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.cli import chatq_here
from tests.support.workers import ROOT, WorkerProcess
from worker.cli.commands import main
from worker.dispatch import send_turn
from worker.events import EventType, TurnEvents, get_redis
from worker.payload import INTERACTIVE_QUEUE, TurnRequest
from worker.producer import create_session
from worker.store import claims
from worker.store.claims import insert_turn


def test_watching_an_unknown_session_says_it_does_not_exist(worker_env: dict[str, str]) -> None:
    unknown = uuid.uuid4()
    result = chatq_here(worker_env, "watch", str(unknown))
    assert result.returncode == 1
    assert result.stderr == f"chatq: error: session {unknown} does not exist\n"
    assert result.stdout == ""


def test_watching_an_unknown_turn_says_it_does_not_exist(worker_env: dict[str, str]) -> None:
    unknown = uuid.uuid4()
    result = chatq_here(worker_env, "watch", "--turn", str(unknown), "--json")
    assert result.returncode == 1
    assert result.stderr == f"chatq: error: turn {unknown} does not exist\n"
    assert result.stdout == ""


@pytest.mark.slow
def test_a_stored_turn_without_events_yet_is_waited_for(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    # Stored as a producer stores it, but not sent and without its `queued` event: nothing in Redis yet.
    session_id = create_session(framework="none", model=STUB_MODEL)
    request = TurnRequest(turn_id=uuid.uuid4(), session_id=session_id, content="watch me [words: 3]")
    with autocommit_scope() as conn:
        insert_turn(conn, request, queue=INTERACTIVE_QUEUE)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "watch", "--turn", str(request.turn_id), "--json"],
        cwd=ROOT,
        env={**os.environ, **worker_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert send_turn(request.to_message(), queue=INTERACTIVE_QUEUE, client=get_redis())
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "started" and events[-1]["type"] == "final"
    assert "".join(e["text"] for e in events if e["type"] == "text") == "w1 w2 w3"


@pytest.mark.slow
def test_a_reply_that_streamed_is_not_printed_again_from_postgres(
    chatq_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # The reply streamed and was stored, then its worker died before `final`: after the stream
    # stays quiet, watch ends with the stored turn, and prints only what did not stream.
    # Stored but not sent: no worker of this package may take it.
    session_id = create_session(framework="none", model="echo")
    request = TurnRequest(turn_id=uuid.uuid4(), session_id=session_id, content="hello")
    with autocommit_scope() as conn:
        insert_turn(conn, request, queue=INTERACTIVE_QUEUE)
    claim = claims.claim_turn(request.turn_id, worker="doomed@host", engine=get_engine(), settings=get_settings()).claim
    assert claim is not None
    events = TurnEvents.resume_with(
        EventType.STARTED,
        claim.attempt,
        session_id=session_id,
        turn_id=claim.turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    )
    events.publish(EventType.TEXT, claim.attempt, text="Hello the")
    events.publish(EventType.TEXT, claim.attempt, text="re")
    reply = [AgentMessage(role="assistant", content="Hello there")]
    assert claims.complete_turn(
        claim, reply, {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, engine=get_engine()
    ).stored
    assert main(["watch", "--turn", str(claim.turn_id)]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello there\n"
    assert err == "[done: 3 prompt + 2 completion tokens]\n"

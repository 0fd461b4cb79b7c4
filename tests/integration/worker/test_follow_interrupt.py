"""Ctrl-C on `chatq submit --follow`: exit 130 and say how to pick the turn up again (a real SIGINT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from models.db import autocommit_scope
from tests.support.workers import ROOT
from worker.payload import INTERACTIVE_QUEUE, TurnRequest
from worker.producer import create_session, delete_session
from worker.queries import turn_report
from worker.store.claims import insert_turn


def _default_sigint() -> None:
    # A test run started in the background ignores SIGINT, and children inherit that: Python turns
    # SIGINT into KeyboardInterrupt only when it starts with the default handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_an_interrupted_follow_says_how_to_reattach(chatq_env: dict[str, str]) -> None:
    # A first turn stored but never sent holds the session: the followed turn stays queued whatever
    # worker runs, so the follow is still waiting when Ctrl-C comes.
    session_id = create_session(framework="none", model="echo")
    with autocommit_scope() as conn:
        insert_turn(
            conn, TurnRequest(turn_id=uuid.uuid4(), session_id=session_id, content="first"), queue=INTERACTIVE_QUEUE
        )
    follow = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "submit", str(session_id), "second", "--follow"],
        cwd=ROOT,
        env={**os.environ, **chatq_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        assert follow.stderr is not None
        turn_id = uuid.UUID(follow.stderr.readline().strip())  # printed just before the follow starts
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=60)
        assert turn_report(turn_id)["status"] == "queued", "Ctrl-C stops the following, not the turn"
    finally:
        follow.kill()
        delete_session(session_id)
    assert follow.returncode == 130
    assert out == ""
    assert "Traceback" not in err
    assert err.strip() == (
        f"chatq: stopped following; turn {turn_id} goes on. "
        f"Re-attach: chatq watch --turn {turn_id}  (stop it: chatq cancel {turn_id})"
    )

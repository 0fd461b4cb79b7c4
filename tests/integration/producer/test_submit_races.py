"""`submit_turn` racing a session delete, against the real Postgres: the submit waits on the session
row the delete holds, and must then say the session is gone, never that its turn "already exists".

The delete is `worker.deletion`'s own statements, held open in a transaction of the test's
until the submit is seen waiting on its lock (pg_stat_activity), then committed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import text

from models.db import autocommit_scope, session_scope
from worker.deletion import _delete_sessions
from worker.errors import ChatqError, SessionNotFound
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.usefixtures("chatq_env")

WAITING_ON_THE_SESSION = text(
    """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%chat_sessions%'
      AND pid <> pg_backend_pid()
    """
)


def _submit_during_delete(submit: Callable[[uuid.UUID], object]) -> BaseException | None:
    """Run `submit` while a delete of its session holds the row, commit the delete, return what it raised."""
    sid = create_session(framework="none", model="echo")
    submit(sid)  # a session with history, as a real one
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            submit(sid)
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    with session_scope() as db:
        _delete_sessions(db, [sid], reason="deleted")
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while True:
            with autocommit_scope() as probe:
                if probe.execute(WAITING_ON_THE_SESSION).scalar_one():
                    break
            assert not outcome, f"the submit did not wait for the delete: {outcome}"
            assert time.monotonic() < deadline, "the submit never waited on the session row"
            time.sleep(0.02)
    thread.join(10)
    assert outcome, "the submit did not return after the delete committed"
    return outcome[0]


@pytest.mark.parametrize(
    "submit",
    [
        pytest.param(lambda sid: submit_turn(sid, "hello"), id="enqueue"),
        pytest.param(lambda sid: submit_turn(sid, "hello", turn_id=uuid.uuid4()), id="own-id"),
        pytest.param(lambda sid: submit_turn(sid, "hello", webhook="https://example.com/hook"), id="webhook"),
        pytest.param(lambda sid: submit_turn(sid, "hello", if_busy="interrupt"), id="interrupt"),
    ],
)
def test_a_submit_racing_a_delete_is_told_the_session_is_gone(submit: Callable[[uuid.UUID], object]) -> None:
    raised = _submit_during_delete(submit)
    assert isinstance(raised, SessionNotFound), f"expected SessionNotFound, got {raised!r}"
    assert isinstance(raised, ChatqError) and "does not exist" in str(raised)

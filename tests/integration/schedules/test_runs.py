"""Scheduled turns run like any turn (in this process, `in_process`, against the model stub): a run
that fails follows the retry rule and the schedule goes on; a run on a session is a turn of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.integration.schedules.conftest import fire
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.inprocess import InProcessWorker
from tests.support.turns import session_messages, wait_for_turn
from worker.producer import create_schedule, create_session, get_schedule, schedule_runs

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def test_a_failing_run_is_retried_then_failed_and_the_schedule_goes_on(in_process: InProcessWorker) -> None:
    schedule = create_schedule(
        session_template={"framework": "plain_openai", "model": STUB_MODEL},
        content="broken model [fail]",
        every=10,
        now=T0,
    )
    assert fire(T0 + timedelta(seconds=10)) == 1
    [first] = schedule_runs(schedule.id)
    row = wait_for_turn(first.turn_id)
    assert (row.status.value, row.attempts) == ("failed", 2), "the retry rule, as for any turn"
    in_process.wait_idle()  # the task records its outcome after the turn's row is committed
    assert in_process.outcomes(first.turn_id) == ["retry", "failed"]
    assert fire(T0 + timedelta(seconds=20)) == 1, "the previous run ended: overlap=skip lets the next one run"
    after = get_schedule(schedule.id)
    assert (after.enabled, after.runs, after.skipped) == (True, 2, 0)


def test_runs_on_a_session_are_its_turns_and_see_its_history(in_process: InProcessWorker) -> None:
    session_id = create_session(framework="plain_openai", model=STUB_MODEL)
    schedule = create_schedule(session_id=session_id, content="status report", every=10, now=T0)
    for second in (10, 20):
        assert fire(T0 + timedelta(seconds=second)) == 1
        [latest, *_] = schedule_runs(schedule.id)
        assert wait_for_turn(latest.turn_id).status.value == "succeeded"
    roles = [(m.role, m.content) for m in session_messages(session_id) if m.role == "user"]
    assert roles == [("user", "status report"), ("user", "status report")]
    assert [run.status for run in schedule_runs(schedule.id)] == ["succeeded", "succeeded"]

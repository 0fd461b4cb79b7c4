"""`chatq worker` as several processes (worker/cli/supervisor.py): each its own node, one service.

The supervisor starts N Celery workers (`--processes N`, default one per core) named `name-1@host`,
`name-2@host`, ...; SIGTERM stops all of them gracefully (running turns handed back); a child that
dies is started again while the service keeps running.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time

import pytest

from tests.faults.helpers import STUB_MODEL, Worker, Workers, wait_finished, wait_for_event
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

STARTED = re.compile(r"started (\d+) worker processes \(pids ([\d, ]+)\)")


def _child_pids(worker: Worker) -> list[int]:
    match = STARTED.search(worker.log())
    assert match, worker.log()[-3000:]
    return [int(pid) for pid in match[2].split(", ")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped) is not running.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _wait_until(condition: object, *, timeout: float, what: str, worker: Worker) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}:\n{worker.log()[-4000:]}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_processes_option_starts_that_many_nodes_and_each_runs_turns(workers: Workers) -> None:
    service = workers.launch(concurrency=1, processes=3).wait_ready(timeout=90)
    assert len(_child_pids(service)) == 3
    # One turn at a time per process (concurrency 1, prefetch 1): three slow turns need all three.
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(3)]
    turns = [submit_turn(s, f"take your time [sleep: 2] #{i}").turn_id for i, s in enumerate(sessions)]
    rows = wait_finished(turns, timeout=60)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    host = socket.gethostname()
    assert {row.worker for row in rows.values()} == {f"{service.name}-{i}@{host}" for i in (1, 2, 3)}


@pytest.mark.timeout(120)
def test_sigterm_stops_every_process_and_hands_the_running_turn_back(workers: Workers, redis_url: str) -> None:
    service = workers.launch(processes=2).wait_ready(timeout=90)
    pids = _child_pids(service)
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    words = 100  # about 10 s of streaming (the tests' turn timeout is 20 s): time to start a second worker
    turn = submit_turn(session_id, f"a long answer please [words: {words}] [slow: 0.1]")
    wait_for_event(redis_url, turn.turn_id, "text", count=3, timeout=30)
    assert workers.owner_of(turn.turn_id) is service
    staying = workers.launch().wait_ready()

    code = service.stop(timeout=30)
    assert code == 0, service.log()[-3000:]
    assert not any(_alive(pid) for pid in pids)
    assert service.log().count("handing running turns back") >= 2  # each process shut down warm

    row = wait_finished([turn.turn_id], timeout=60)[turn.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(staying.hostname_prefix)
    assert row.attempts == 1  # a hand-back is not a failed attempt
    events = replay_events(redis_url, turn.turn_id)
    retries = [event for event in events if event["type"] == "retry"]
    assert len(retries) == 1 and "shutting down" in retries[0]["error"]
    assert turn_messages(turn.turn_id)[1].content.split() == [f"w{i}" for i in range(1, words + 1)]


@pytest.mark.timeout(120)
def test_a_killed_process_is_started_again_and_the_service_keeps_serving(workers: Workers) -> None:
    service = workers.launch(processes=2).wait_ready(timeout=90)
    first, second = _child_pids(service)
    os.kill(first, signal.SIGKILL)
    _wait_until(
        lambda: "process 1 started again" in service.log() and service.log().count(" ready.") >= 3,
        timeout=60,
        what="the killed process was not started again",
        worker=service,
    )
    assert f"process 1 (pid {first}) exited with status -9" in service.log()
    assert service.alive and _alive(second)

    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(4)]
    turns = [submit_turn(s, f"hello #{i}").turn_id for i, s in enumerate(sessions)]
    rows = wait_finished(turns, timeout=60)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    assert service.stop(timeout=30) == 0

"""`chatq worker` with several processes is one service: one metrics endpoint counts every process,
and its node names are its own on this host (worker/ops/service_metrics.py, worker/cli/node_names.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.request
import uuid

import pytest

from models.db import session_scope
from models.tables import Turn
from tests.faults.helpers import STUB_MODEL, Worker, Workers, read_db, wait_finished
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

STARTED = re.compile(r"started (\d+) worker processes \(pids ([\d, ]+)\)")
READY = re.compile(r"([\w.-]+@[\w.-]+) ready\.")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _wait_for(what: str, condition: object, service: Worker, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}:\n{service.log()[-4000:]}"
        time.sleep(0.1)


def _pids(service: Worker) -> list[int]:
    match = STARTED.search(service.log())
    assert match, service.log()[-3000:]
    return [int(pid) for pid in match[2].split(", ")]


def _node_of(turn_id: uuid.UUID) -> str:
    with session_scope() as db:
        row = db.get(Turn, turn_id)
        assert row is not None and row.worker, "the turn has no worker"
        return row.worker


def _nodes(service: Worker) -> set[str]:
    return set(READY.findall(service.log()[service.log_offset :]))


@pytest.mark.timeout(240)
def test_one_scrape_counts_the_turns_of_every_process(workers: Workers) -> None:
    port = _free_port()
    limits = json.dumps({STUB_MODEL: {"rpm": 6000}})  # so the provider gauges have a scope to show
    service = workers.launch(
        concurrency=1, processes=2, env={"CHATQ_METRICS_PORT": str(port), "CHATQ_MODEL_LIMITS": limits}
    )
    service.wait_ready(timeout=120)
    assert _scrape(port).get('chatq_queue_depth{queue="chatq"}') is not None  # read from Redis at scrape

    # One turn at a time per process: slow turns spread over both.
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(4)]
    turns = [submit_turn(s, f"take your time [sleep: 1.5] #{i}").turn_id for i, s in enumerate(sessions)]
    rows = wait_finished(turns, timeout=90)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    assert len({row.worker for row in rows.values()}) == 2, "both processes ran turns"

    samples = _scrape(port)
    # Before: one process of the two bound the port and counted only its own turns.
    assert samples['chatq_turns_total{status="succeeded"}'] == len(turns)
    assert samples['chatq_turn_duration_seconds_count{framework="langgraph"}'] == len(turns)
    prompt = sum(row.prompt_tokens or 0 for row in rows.values())
    assert samples[f'chatq_tokens_total{{kind="prompt",model="{STUB_MODEL}"}}'] == prompt
    assert samples["chatq_turns_in_flight"] == 0
    assert samples[f'chatq_provider_requests_total{{model="{STUB_MODEL}"}}'] == len(turns)
    # A scope the processes listed (the fleet's adaptive limit may hold it under the configured one).
    assert 0 < samples[f'chatq_provider_allowed_rpm{{model="{STUB_MODEL}"}}'] <= 6000

    # A process killed during a turn: its running turn no longer counts in flight, its counts stay.
    stuck = submit_turn(create_session(framework="langgraph", model=STUB_MODEL), "hold on [sleep: 60]").turn_id
    _wait_for("the turn never showed in flight", lambda: _scrape(port)["chatq_turns_in_flight"] == 1, service)
    node = read_db(lambda: _node_of(stuck))
    index = int(node.split("@")[0].rsplit("-", 1)[1])
    pid = _pids(service)[index - 1]
    os.kill(pid, signal.SIGKILL)
    _wait_for("the killed process was not noticed", lambda: f"(pid {pid}) exited" in service.log(), service)
    samples = _scrape(port)
    assert samples["chatq_turns_in_flight"] == 0
    assert samples['chatq_turns_total{status="succeeded"}'] == len(turns)
    assert service.stop(timeout=60) == 0


@pytest.mark.timeout(240)
def test_a_second_service_on_the_host_takes_other_node_names_and_logs_a_taken_metrics_port(
    workers: Workers,
) -> None:
    first = workers.launch(concurrency=1, processes=2, name="twin").wait_ready(timeout=120)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = int(taken.getsockname()[1])
        second = workers.launch(concurrency=1, processes=2, name="twin", env={"CHATQ_METRICS_PORT": str(port)})
        second.wait_ready(timeout=120)
    host = socket.gethostname()
    assert _nodes(first) == {f"twin-1@{host}", f"twin-2@{host}"}
    # Before: the second service's processes were twin-1 and twin-2 again.
    assert _nodes(second) == {f"twin-3@{host}", f"twin-4@{host}"}, second.log()[-3000:]
    assert f"twin-1@{host}, twin-2@{host} run in another service on this host" in second.log()
    errors = [line for line in second.log().splitlines() if "cannot serve metrics" in line]
    assert errors and f"127.0.0.1:{port}" in errors[0] and "ERROR" in errors[0], second.log()[-3000:]
    assert second.stop(timeout=60) == 0 and first.stop(timeout=60) == 0


@pytest.mark.timeout(120)
def test_a_single_worker_logs_a_metrics_port_it_cannot_bind_as_an_error(workers: Workers) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = int(taken.getsockname()[1])
        worker = workers.launch(env={"CHATQ_METRICS_PORT": str(port)}).wait_ready(timeout=90)
    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    errors = [r for r in records if "cannot serve metrics" in r["message"]]
    # Before: a traceback from Celery's signal dispatch, before the worker's logging was set up.
    assert [r["level"] for r in errors] == ["ERROR"], worker.log()[-3000:]
    assert f"127.0.0.1:{port}" in errors[0]["message"] and "Traceback" not in worker.log()
    assert worker.alive

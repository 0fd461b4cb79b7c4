"""Metrics and structured logs of a real worker."""

from __future__ import annotations

import ipaddress
import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.integration.worker.conftest import STUB_MODEL
from tests.support.turns import wait_for_turn
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def metrics_worker(worker_env: dict[str, str], worker: WorkerProcess) -> Iterator[tuple[WorkerProcess, int]]:
    # One for the module's tests (a start-up costs seconds of CPU): they read its endpoint and its
    # log, each for a turn of its own; the metrics are compared before and after that turn.
    # The package's shared worker is stopped for the duration so this one runs the turns.
    worker.stop()
    port = free_port()
    process = WorkerProcess({**worker_env, "CHATQ_METRICS_PORT": str(port)}, concurrency=2).start()
    try:
        yield process, port
    finally:
        process.stop()
        worker.start()


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


# First in the module: it reads the package worker's log before the module fixture below stops it
# (and restarts it under the same name, which appends a second start-up to that log).
def test_the_worker_freezes_its_startup_objects_once_ready(worker: WorkerProcess) -> None:
    # worker.ops.gc_freeze: the start-up heap (~230,000 objects with the adapters preloaded) leaves full GC passes.
    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    frozen = [r for r in records if r["logger"] == "worker.ops.signals" and "start-up objects" in r["message"]]
    assert len(frozen) == 1
    count = int(frozen[0]["message"].split()[1])
    assert count > 50_000  # the preloaded adapters are in it, not just Celery
    ready = next(i for i, r in enumerate(records) if r["message"].endswith(" ready."))
    assert records.index(frozen[0]) < ready  # on worker_ready, before Celery says it is ready


def test_metrics_show_a_finished_turns_tokens_and_latency(metrics_worker: tuple[WorkerProcess, int]) -> None:
    _process, port = metrics_worker
    before = scrape(port)
    assert before.get('chatq_queue_depth{queue="chatq"}') is not None
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, "count me [words: 7]")
    row = wait_for_turn(turn.turn_id)
    assert row.status.value == "succeeded"
    time.sleep(0.2)
    after = scrape(port)
    assert after['chatq_turns_total{status="succeeded"}'] == before.get('chatq_turns_total{status="succeeded"}', 0) + 1
    assert after[f'chatq_tokens_total{{kind="prompt",model="{STUB_MODEL}"}}'] == row.prompt_tokens
    assert after[f'chatq_tokens_total{{kind="completion",model="{STUB_MODEL}"}}'] == row.completion_tokens
    assert after['chatq_turn_duration_seconds_count{framework="langgraph"}'] == 1
    assert after['chatq_turn_duration_seconds_sum{framework="langgraph"}'] > 0
    assert after['chatq_time_to_first_token_seconds_count{framework="langgraph"}'] == 1
    assert after["chatq_turns_in_flight"] == 0


def test_logs_are_json_lines_with_turn_context_and_no_user_content(
    metrics_worker: tuple[WorkerProcess, int],
) -> None:
    process, _port = metrics_worker
    secret_words = "purple elephants negotiate quietly"
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    turn = submit_turn(session_id, secret_words)
    assert wait_for_turn(turn.turn_id).status.value == "succeeded"
    time.sleep(0.3)
    records = []
    for line in process.log().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    assert records, "no JSON log lines"
    mine = [r for r in records if r.get("turn_id") == str(turn.turn_id)]
    assert any("succeeded on attempt 1" in r["message"] for r in mine)
    assert all(r["session_id"] == str(session_id) for r in mine)
    assert any(r.get("attempt") == 1 for r in mine)
    assert secret_words not in process.log()
    assert "sk-test-not-a-secret" not in process.log()
    # The HTTP client's one INFO line per model request is held back (worker.ops.logs.quiet_http_clients).
    assert not [r for r in records if r["logger"].startswith("httpx")]


def _outward_address() -> str | None:
    """This machine's address on its network (not loopback), or None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # a UDP "connect" only picks the route: nothing is sent
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def test_metrics_listen_on_loopback_unless_exposed_on_purpose(
    metrics_worker: tuple[WorkerProcess, int], worker_env: dict[str, str]
) -> None:
    _process, port = metrics_worker
    outward = _outward_address()
    if outward is None:
        pytest.skip("this machine has no non-loopback address to test from")
    assert _answers("127.0.0.1", port)
    assert not _answers(outward, port), "the unauthenticated metrics endpoint is reachable from the network"

    exposed_port = free_port()
    exposed = WorkerProcess(
        {**worker_env, "CHATQ_METRICS_PORT": str(exposed_port), "CHATQ_METRICS_ADDR": "0.0.0.0"}, concurrency=1
    ).start()
    try:
        assert _answers(outward, exposed_port)
    finally:
        exposed.stop()

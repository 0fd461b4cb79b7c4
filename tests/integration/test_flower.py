"""`chatq flower` against a real worker: authentication, redacted task arguments, Prometheus metrics."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.fixtures import STUB_API_KEY
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import wait_for_turn
from tests.support.workers import ROOT, WorkerProcess

pytestmark = pytest.mark.slow

USER, PASSWORD = "flower-admin", "pw-" + uuid.uuid4().hex[:12]
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class FlowerProcess:
    """`run_flower` in a subprocess (what `chatq flower` runs), with its log in a file."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="chatq-flower-")) / "flower.log"
        code = "import sys; from worker.ops.flower import run_flower; run_flower(sys.argv[1:])"
        args = [f"--port={self.port}", "--address=127.0.0.1", "--inspect_timeout=3000"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, *, auth: tuple[str, str] | None = (USER, PASSWORD)) -> tuple[int, str]:
        """Status and body of a GET (error statuses included)."""
        request = urllib.request.Request(self.base + path)
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower exited at start:\n{self.log()[-4000:]}")
            try:
                if self.get("/healthcheck", auth=None)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"flower did not answer:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _eventually(probe: Callable[[], T | None], what: str, timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def worker(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[WorkerProcess]:
    # Echo sessions need no network; the stub serves the session that exercises a retry.
    env = {**chatq_env, "CHATQ_MODEL": "echo", "OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": STUB_API_KEY}
    process = WorkerProcess(env, concurrency=2).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def flower(chatq_env: dict[str, str], worker: WorkerProcess) -> Iterator[FlowerProcess]:
    env = {**os.environ, **chatq_env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}", "PYTHONUNBUFFERED": "1"}
    process = FlowerProcess(env)
    try:
        process.wait_ready()
        # Task events reach Flower only once it listens: wait until it has seen the worker's heartbeat.
        _eventually(
            lambda: True if f'flower_worker_online{{worker="{worker.name}@' in process.get("/metrics")[1] else None,
            "Flower to receive the worker's events",
        )
        yield process
    finally:
        process.stop()
        assert PASSWORD not in process.log(), "Flower logged the basic-auth password"


def _finished_task(flower: FlowerProcess, task_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status, body = flower.get(f"/api/task/info/{task_id}")
        if status != 200:
            return None
        task: dict[str, Any] = json.loads(body)
        return task if task.get("state") in ("SUCCESS", "FAILURE") else None

    return _eventually(probe, f"Flower to show task {task_id} finished")


def _seen(flower: FlowerProcess, task_id: str, *events: str) -> dict[str, Any] | None:
    """Flower's view of a task once it has recorded each of `events` (its timestamps are set)."""
    status, body = flower.get(f"/api/task/info/{task_id}")
    if status != 200:
        return None
    task: dict[str, Any] = json.loads(body)
    return task if all(task.get(event) for event in events) else None


def test_api_refuses_requests_without_credentials(flower: FlowerProcess) -> None:
    assert flower.get("/api/workers", auth=None)[0] == 401
    assert flower.get("/api/workers", auth=(USER, "wrong-password"))[0] == 401
    assert flower.get("/api/tasks", auth=None)[0] == 401
    assert flower.get("/", auth=None)[0] == 401


def test_api_lists_the_worker_with_credentials(flower: FlowerProcess, worker: WorkerProcess) -> None:
    def probe() -> dict[str, Any] | None:
        status, body = flower.get("/api/workers?refresh=1")
        assert status == 200, body
        workers: dict[str, Any] = json.loads(body)
        return workers if any(name.startswith(f"{worker.name}@") for name in workers) else None

    workers = _eventually(probe, "the worker in /api/workers")
    assert "chatq.run_turn" in next(w for n, w in workers.items() if n.startswith(f"{worker.name}@"))["registered"]


def test_task_arguments_show_ids_and_sizes_not_the_message(flower: FlowerProcess) -> None:
    from worker.producer import create_session, submit_turn

    session_id = create_session(framework="none", model="echo")
    turn = submit_turn(session_id, "hello flower")
    task = _finished_task(flower, str(turn.turn_id))
    assert task["name"] == "chatq.run_turn"
    assert task["state"] == "SUCCESS", task
    assert task["uuid"] == str(turn.turn_id)
    assert str(session_id) in task["kwargs"]
    assert "hello flower" not in task["kwargs"]
    assert "<12 chars>" in task["kwargs"]

    status, body = flower.get("/api/tasks?limit=100")
    assert status == 200
    listed = json.loads(body)[str(turn.turn_id)]
    assert "hello flower" not in json.dumps(listed)
    status, page = flower.get(f"/task/{turn.turn_id}")
    assert status == 200 and str(turn.turn_id) in page
    assert "hello flower" not in page


def test_a_retried_turn_still_hides_the_message(flower: FlowerProcess, openai_stub: OpenAIStub) -> None:
    from worker.producer import create_session, submit_turn

    key = uuid.uuid4().hex
    session_id = create_session(framework="none", model="gpt-4o-mini")
    turn = submit_turn(session_id, f"private words [fail-once: {key}]")
    assert wait_for_turn(turn.turn_id).status.value == "succeeded"
    # Flower has every event of the task, its retry included (Celery 5.6 dropped some of a retried
    # task's events under the thread pool; chatq.shortcuts.celery_events keeps them).
    task = _eventually(
        lambda: _seen(flower, str(turn.turn_id), "received", "retried", "succeeded"), "the task's events"
    )
    assert task["state"] == "SUCCESS", task
    assert "private words" not in json.dumps(task), {k: v for k, v in task.items() if "private" in str(v)}


def test_prometheus_metrics_with_credentials(flower: FlowerProcess) -> None:
    # Flower itself serves /metrics to anyone; chatq's Flower asks for the same credentials.
    assert flower.get("/metrics", auth=None)[0] == 401
    assert flower.get("/metrics", auth=(USER, "wrong-password"))[0] == 401
    assert flower.get("/healthcheck", auth=None) == (200, "OK")  # for container health checks only
    status, body = flower.get("/metrics")
    assert status == 200
    assert "flower_events_total" in body
    assert "flower_worker_online" in body
    assert "hello flower" not in body


def test_a_rejected_message_and_a_failed_turn_end_their_tasks_as_failures(
    flower: FlowerProcess, worker: WorkerProcess, openai_stub: OpenAIStub
) -> None:
    from worker.app import app
    from worker.producer import create_session, submit_turn

    # A message rejected for its arguments ends its task in FAILURE, as Flower shows it.
    rejected = str(uuid.uuid4())
    kwargs = {"turn_id": rejected, "session_id": str(uuid.uuid4()), "content": "   "}
    app.send_task("chatq.run_turn", kwargs=kwargs, task_id=rejected, queue="chatq")
    task = _finished_task(flower, rejected)
    assert task["state"] == "FAILURE", task
    assert "content is empty" in (task.get("exception") or ""), task

    # A turn that fails after its retry ends its task the same way: FAILURE with chatq's error, not
    # retried by Celery, and logged as expected (one line, no traceback).
    session_id = create_session(framework="none", model="gpt-4o-mini")
    turn = submit_turn(session_id, "private words [fail]")
    task = _finished_task(flower, str(turn.turn_id))
    assert task["state"] == "FAILURE", task
    assert "TurnFailed" in (task.get("exception") or ""), task
    assert "private words" not in json.dumps(task)
    status, body = flower.get("/api/tasks?state=FAILURE&limit=100")
    assert status == 200 and {rejected, str(turn.turn_id)} <= set(json.loads(body))
    line = f"chatq.run_turn[{turn.turn_id}] raised expected: TurnFailed("
    _eventually(lambda: True if line in worker.log() else None, "the task's failure line")
    assert "Traceback" not in worker.log()
    assert "private words" not in worker.log()

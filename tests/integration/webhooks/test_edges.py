"""Webhooks and cancel from the other edges: the `chatq` command line, batch files and the HTTP gateway.

The gateway and `chatq batch` are real subprocesses, the other commands the CLI's `main` in this
process (`tests.support.cli.chatq_here`); the turns and deliveries they queue run in this process
(`in_process`).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gateway.conftest import TOKEN, GatewayProcess
from tests.integration.webhooks.conftest import SECRET, STUB_MODEL
from tests.support.cli import chatq, chatq_here
from tests.support.inprocess import InProcessWorker
from tests.support.receiver import Receiver
from tests.support.turns import wait_for_status, wait_for_turn
from worker.producer import create_session, submit_turn
from worker.queries import turn_report

WORKER_ENV = {"CHATQ_WEBHOOK_SECRET": SECRET, "CHATQ_WEBHOOK_ALLOW_PRIVATE": "1", "CHATQ_WEBHOOK_BACKOFF": "0.2"}


@pytest.fixture
def in_process_env() -> dict[str, str]:
    return WORKER_ENV


@pytest.fixture
def cli_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "CHATQ_WEBHOOK_ALLOW_PRIVATE": "1"}


def _delivered(turn_id: uuid.UUID, *, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        webhook = turn_report(turn_id)["webhook"]
        if webhook is not None and webhook["status"] == "delivered":
            return dict(webhook)
        assert time.monotonic() < deadline, f"delivery of {turn_id} not delivered: {webhook}"
        time.sleep(0.05)


def test_the_cli_creates_a_session_with_a_webhook_and_show_prints_its_delivery(
    in_process: InProcessWorker, receiver: Receiver, cli_env: dict[str, str]
) -> None:
    url = receiver.answer("/cli")
    created = chatq_here(cli_env, "session", "create", "--model", STUB_MODEL, "--webhook", url)
    assert created.returncode == 0, created.stderr
    submitted = chatq_here(cli_env, "submit", created.stdout.strip(), "hello [words: 2]")
    assert submitted.returncode == 0, submitted.stderr
    turn_id = uuid.UUID(submitted.stdout.strip())
    webhook = _delivered(turn_id)
    shown = chatq_here(cli_env, "show", str(turn_id))
    line = next(text for text in shown.stdout.splitlines() if text.startswith("webhook"))
    assert url in line and "delivered after 1 attempt(s), last HTTP 200" in line and webhook["delivery_id"] in line
    assert json.loads(chatq_here(cli_env, "show", str(turn_id), "--json").stdout)["webhook"] == webhook
    refused = chatq_here(cli_env, "session", "create", "--webhook", "ftp://example.com/x")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "http:// or https://" in refused.stderr and "Traceback" not in refused.stderr


def test_the_cli_says_when_a_turn_was_already_cancelled(in_process: InProcessWorker, cli_env: dict[str, str]) -> None:
    session_id = create_session(framework="langgraph", model=STUB_MODEL)
    running = submit_turn(session_id, "slowly [words: 80] [slow: 0.2]")
    queued = submit_turn(session_id, "later")
    wait_for_status(running.turn_id, "running")
    assert chatq_here(cli_env, "cancel", str(queued.turn_id)).stdout.strip() == f"turn {queued.turn_id} cancelled"
    again = chatq_here(cli_env, "cancel", str(queued.turn_id))
    assert again.returncode == 0 and again.stdout.strip() == f"turn {queued.turn_id} was already cancelled"
    asked = chatq_here(cli_env, "cancel", str(running.turn_id)).stdout.strip()
    assert asked == f"turn {running.turn_id} is running; asked it to stop"
    wait_for_turn(running.turn_id)
    done = chatq_here(cli_env, "cancel", str(running.turn_id)).stdout.strip()
    assert done == f"turn {running.turn_id} was already cancelled"


@pytest.mark.slow  # `chatq batch` as a real subprocess
def test_a_batch_sessions_webhook_gets_every_turn_and_a_bad_one_names_its_line(
    in_process: InProcessWorker, receiver: Receiver, cli_env: dict[str, str], tmp_path: Path
) -> None:
    url = receiver.answer("/batch")
    source = tmp_path / "batch.jsonl"
    lines = [
        {"id": "a", "session": {"model": STUB_MODEL, "webhook": url}, "turns": ["one [words: 2]", "two [words: 2]"]},
        {"id": "b", "session": {"webhook": "gopher://example.com"}, "turns": ["never"]},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    bad = chatq(cli_env, "batch", str(source), "--batch-id", uuid.uuid4().hex)
    assert bad.returncode != 0 and "line 2" in bad.stderr and '"session.webhook"' in bad.stderr
    result = chatq(cli_env, "batch", str(source), "--skip-invalid", "--batch-id", uuid.uuid4().hex)
    assert result.returncode == 0, result.stderr
    received = receiver.wait_for(2, "/batch")
    assert sorted(json.loads(r.body)["messages"][0]["content"] for r in received) == [
        "one [words: 2]",
        "two [words: 2]",
    ]


@pytest.mark.slow  # the gateway as a real subprocess
def test_the_gateway_takes_webhooks_shows_deliveries_and_says_already_cancelled(
    in_process: InProcessWorker, receiver: Receiver, cli_env: dict[str, str]
) -> None:
    url = receiver.answer("/gateway")
    gateway = GatewayProcess({**cli_env, "CHATQ_API_TOKEN": TOKEN}).wait_ready()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as api:
            bad = api.post("/sessions", json={"model": STUB_MODEL, "webhook": "ftp://example.com/x"})
            assert bad.status_code == 422 and "http:// or https://" in bad.json()["error"]
            session_id = api.post("/sessions", json={"model": STUB_MODEL, "webhook": url}).json()["session_id"]
            turn_id = api.post(f"/sessions/{session_id}/turns", json={"content": "hi [words: 2]"}).json()["turn_id"]
            webhook = _delivered(uuid.UUID(turn_id))
            shown = api.get(f"/turns/{turn_id}").json()
            assert shown["webhook"] == webhook and webhook["url"] == url
            (received,) = receiver.wait_for(1, "/gateway")
            assert json.loads(received.body) == {key: value for key, value in shown.items() if key != "webhook"}

            # A turn's own webhook, and a cancel said twice.
            own_url = receiver.answer("/own")
            busy = api.post(f"/sessions/{session_id}/turns", json={"content": "slow [words: 40] [slow: 0.2]"}).json()
            own = api.post(f"/sessions/{session_id}/turns", json={"content": "later", "webhook": own_url}).json()
            assert api.get(f"/turns/{own['turn_id']}").json()["webhook"]["status"] is None  # not ended yet
            first = api.post(f"/turns/{own['turn_id']}/cancel").json()
            again = api.post(f"/turns/{own['turn_id']}/cancel").json()
            assert (first["already_cancelled"], again["already_cancelled"]) == (False, True)
            (cancelled,) = receiver.wait_for(1, "/own")
            assert cancelled.headers["x-chatq-event"] == "turn.cancelled"
            api.post(f"/turns/{busy['turn_id']}/cancel")
    finally:
        gateway.stop()

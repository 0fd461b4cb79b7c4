"""Where chatq refuses to send: not http(s), and private or loopback addresses unless CHATQ_WEBHOOK_ALLOW_PRIVATE=1."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.integration.webhooks.conftest import SECRET, STUB_MODEL
from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.receiver import Receiver
from tests.support.turns import wait_for_turn
from worker.errors import WebhookRefused
from worker.producer import create_session, submit_turn
from worker.queries import turn_report


@pytest.fixture
def in_process_env() -> dict[str, str]:
    """The in-process runtime without CHATQ_WEBHOOK_ALLOW_PRIVATE (the default)."""
    return {"CHATQ_WEBHOOK_SECRET": SECRET}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/hook", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://user:pw@example.com/hook", "user name or password"),
        ("http://127.0.0.1:8080/hook", "loopback address"),
        ("http://10.1.2.3/hook", "private address"),
        ("http://169.254.169.254/latest/meta-data", "link-local address"),
        ("http://[::1]/hook", "loopback address"),
        ("http://[::ffff:192.168.0.1]/hook", "private address"),
        ("http:///nohost", "no host"),
        ("https://example.com/ hook", "spaces"),
    ],
)
def test_a_webhook_chatq_will_not_call_is_refused_when_stored(chatq_env: dict[str, str], url: str, why: str) -> None:
    session_id = uuid.uuid4()
    with pytest.raises(WebhookRefused, match=why):
        create_session(framework="langgraph", webhook=url, session_id=session_id)
    stored = create_session(framework="langgraph")
    with pytest.raises(WebhookRefused, match=why):
        submit_turn(stored, "hello", webhook=url)
    from models.db import session_scope
    from models.tables import ChatSession, Turn

    with session_scope() as db:
        assert db.get(ChatSession, session_id) is None
        assert db.query(Turn).filter(Turn.session_id == stored).count() == 0


def _failed_delivery(turn_id: uuid.UUID, *, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        webhook = turn_report(turn_id)["webhook"]
        if webhook is not None and webhook["status"] == "failed":
            return dict(webhook)
        assert time.monotonic() < deadline, f"delivery of {turn_id} did not fail: {webhook}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_a_host_that_resolves_to_a_loopback_address_is_refused_at_delivery(
    in_process: InProcessWorker, receiver: Receiver
) -> None:
    # A host name passes when stored (it is resolved only when sent): this one is the receiver's.
    url = receiver.answer("/hook").replace("127.0.0.1", "localhost")
    session_id = create_session(framework="langgraph", model=STUB_MODEL, webhook=url)
    turn = submit_turn(session_id, "hello [words: 2]")
    assert wait_for_turn(turn.turn_id).status.value == "succeeded"

    webhook = _failed_delivery(turn.turn_id)
    assert "resolves to a loopback address" in webhook["last_error"]
    assert "CHATQ_WEBHOOK_ALLOW_PRIVATE=1 in the environment of the workers" in webhook["last_error"]
    assert webhook["attempts"] == 0 and webhook["last_status_code"] is None, "attempts count POSTs: none was made"
    assert receiver.received() == []


def test_a_refused_address_counts_no_attempt_and_the_hint_names_the_worker(
    chatq_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One delivery attempt run in this process, as a worker without CHATQ_WEBHOOK_ALLOW_PRIVATE runs it."""
    from models.db import session_scope
    from models.tables import DeliveryStatus, WebhookDelivery
    from tests.support.factories import add_turn, assistant, user
    from worker.cli.commands import main
    from worker.runtime.webhooks.deliveries import DeliveryOutcome, deliver

    session_id = create_session(framework="none", model="echo")
    turn = add_turn(session_id, [user("q"), assistant("a")])
    delivery_id = uuid.uuid4()
    with session_scope() as db:  # as scheduling records it, without a task message another worker could take
        db.add(
            WebhookDelivery(
                id=delivery_id,
                turn_id=turn.id,
                url="http://localhost:9/hook",
                status=DeliveryStatus.PENDING,
                attempts=0,
            )
        )
    refused = {"outcome": "refused"}
    before = REGISTRY.get_sample_value("chatq_webhook_attempts_total", refused) or 0.0
    assert deliver(delivery_id, runtime=build_runtime()).outcome == DeliveryOutcome.FAILED
    assert REGISTRY.get_sample_value("chatq_webhook_attempts_total", refused) == before + 1, "not counted as a POST"
    webhook = turn_report(turn.id)["webhook"]
    assert (webhook["status"], webhook["attempts"], webhook["last_status_code"]) == ("failed", 0, None)
    assert webhook["last_error"].startswith("webhook host 'localhost' resolves to a loopback address (")
    assert webhook["last_error"].endswith(
        "; to allow it, set CHATQ_WEBHOOK_ALLOW_PRIVATE=1 in the environment of the workers (they send the POST)"
    )
    assert main(["show", str(turn.id)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("webhook"))
    assert line.startswith("webhook  http://localhost:9/hook  failed, no POST made: webhook host 'localhost' resolves")
    assert "attempt(s)" not in line

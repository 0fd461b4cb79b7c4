"""Delayed turns from the command line (`chatq submit --at/--in`, `chatq show`, `chatq cancel`, run in
this process) and over HTTP (`run_at`/`delay` of `POST /sessions/{id}/turns`, the gateway app in
this process), tenant-scoped as everything there, against the real Postgres and Redis."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import delete
from starlette.testclient import TestClient

from chatq.gateway_variables import TenantToken
from chatq.settings import get_settings
from models.db import session_scope
from models.tables import Turn, TurnStatus
from worker.cli.commands import main
from worker.delays import parse_in
from worker.gateway.app import create_app
from worker.gateway.config import GatewaySettings
from worker.payload import GUARDED_QUEUES
from worker.producer import create_session

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"
TOKENS = {ACME: "acme-" + secrets.token_hex(16), GLOBEX: "globex-" + secrets.token_hex(16)}


@pytest.fixture(autouse=True)
def _clean(chatq_env: dict[str, str], redis_url: str) -> Iterator[None]:
    """No delayed turn or task message is left for another test's due step or worker."""
    yield
    with session_scope() as db:
        db.execute(delete(Turn).where(Turn.status == TurnStatus.DELAYED))
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`chatq ARGS...` in this process: exit code, stdout, stderr (usage errors exit through SystemExit)."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400), ("1.5m", 90)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_in(text) == seconds


def test_submit_in_and_at_store_a_delayed_turn_shown_with_its_time(capsys: pytest.CaptureFixture[str]) -> None:
    sid = str(create_session(framework="none", model="echo"))
    before = datetime.now(UTC)
    code, out, err = run(capsys, "submit", sid, "in a while", "--in", "5m", "--json")
    assert code == 0, err
    submitted = json.loads(out)
    assert submitted["position"] is None and submitted["created"]
    due = datetime.fromisoformat(submitted["run_at"])
    assert before + timedelta(minutes=5) <= due <= datetime.now(UTC) + timedelta(minutes=5)

    code, out, err = run(capsys, "show", submitted["turn_id"], "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["status"], shown["position"], shown["messages"]) == ("delayed", None, [])
    assert datetime.fromisoformat(shown["run_at"]) == due
    assert shown["pending_input"] == {"content": "in a while", "images": None}
    code, out, err = run(capsys, "show", submitted["turn_id"])
    assert "no position until due" in out and f"run at   {due.isoformat()}" in out
    assert "[user, when due] in a while" in out

    code, out, err = run(capsys, "submit", sid, "at nine", "--at", "2099-01-01T09:00:00+01:00")
    assert code == 1 and "more than 366 days" in err and err.count("\n") == 1
    at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    code, out, err = run(capsys, "submit", sid, "tomorrow", "--at", at)
    assert code == 0, err
    turn_id = out.strip()
    code, out, err = run(capsys, "cancel", turn_id)
    assert (code, out.strip()) == (0, f"turn {turn_id} cancelled")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--in", "soon"), "is not a duration"),
        (("--in=-5s",), "is not a duration"),
        (("--at", "tomorrow"), "is not an ISO 8601 time"),
        (("--at", "2030-01-01T09:00:00"), "has no timezone offset"),
        (("--at", "2030-01-01T09:00:00Z", "--in", "5m"), "not allowed with argument"),
    ],
)
def test_bad_times_are_usage_errors(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], says: str) -> None:
    sid = str(create_session(framework="none", model="echo"))
    code, out, err = run(capsys, "submit", sid, "x", *args)
    assert (code, out) == (2, "") and says in err


@pytest.fixture
def gateway(chatq_env: dict[str, str]) -> Iterator[TestClient]:
    """The gateway app in this process, with two tenants' tokens."""
    settings = GatewaySettings(tenant_tokens=tuple(TenantToken(tenant=t, token=k) for t, k in TOKENS.items()))
    with TestClient(create_app(settings, chatq=get_settings()), base_url="http://localhost") as client:
        yield client


def _as(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


def test_http_run_at_and_delay_are_tenant_scoped(gateway: TestClient) -> None:
    created = gateway.post("/sessions", json={"framework": "none", "model": "echo"}, headers=_as(ACME))
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    run_at = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    posted = gateway.post(f"/sessions/{sid}/turns", json={"content": "later", "run_at": run_at}, headers=_as(ACME))
    assert posted.status_code == 202, posted.text
    body = posted.json()
    assert body["position"] is None and datetime.fromisoformat(body["run_at"]) == datetime.fromisoformat(run_at)
    shown = gateway.get(f"/turns/{body['turn_id']}", headers=_as(ACME))
    assert shown.status_code == 200 and shown.json()["status"] == "delayed"
    assert datetime.fromisoformat(shown.json()["run_at"]) == datetime.fromisoformat(run_at)

    delayed = gateway.post(f"/sessions/{sid}/turns", json={"content": "soon", "delay": 90}, headers=_as(ACME))
    assert delayed.status_code == 202 and delayed.json()["run_at"] is not None

    # Another tenant finds neither the session to submit to nor the delayed turn to see or cancel.
    other = gateway.post(f"/sessions/{sid}/turns", json={"content": "x", "delay": 5}, headers=_as(GLOBEX))
    missing = gateway.post(f"/sessions/{uuid.uuid4()}/turns", json={"content": "x", "delay": 5}, headers=_as(GLOBEX))
    assert other.status_code == missing.status_code == 404
    assert gateway.get(f"/turns/{body['turn_id']}", headers=_as(GLOBEX)).status_code == 404
    assert gateway.post(f"/turns/{body['turn_id']}/cancel", headers=_as(GLOBEX)).status_code == 404
    cancelled = gateway.post(f"/turns/{body['turn_id']}/cancel", headers=_as(ACME))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

    for bad, says in [
        ({"run_at": "2030-01-01T09:00:00"}, "has no timezone offset"),
        ({"run_at": "soon"}, "is not an ISO 8601 time"),
        ({"delay": "90s"}, "delay must be a number"),
        ({"delay": -3}, "delay must be a number of seconds >= 0"),
        ({"delay": 5, "run_at": run_at}, "not both"),
        ({"delay": 5, "if_busy": "reject"}, "cannot be combined with a delay"),
    ]:
        refused = gateway.post(f"/sessions/{sid}/turns", json={"content": "x", **bad}, headers=_as(ACME))
        assert refused.status_code == 422 and says in refused.text, (bad, refused.text)
    turns = gateway.get(f"/sessions/{sid}/turns", headers=_as(ACME))
    assert turns.status_code == 200 and turns.json()["turns"] == []  # delayed turns are not in the history yet

"""Liveness and readiness of a real `chatq serve`, and what it answers while Redis or Postgres is down.

"Down" is real: the gateway is pointed at a port where nothing listens, or at a socket that
accepts connections and never says a word (a hung server). The machine's services are not touched.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from models.db import session_scope
from models.tables import ChatMessage, Turn
from tests.integration.gateway.conftest import STUB_MODEL, TOKEN, GatewayProcess, free_port
from worker.producer import cancel_turn

pytestmark = pytest.mark.slow


@pytest.fixture
def silent_ports() -> Iterator[tuple[int, int]]:
    """Two ports whose listeners take connections and never answer (hung Postgres and Redis)."""
    listeners = []
    for _ in range(2):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # never accept(): the kernel completes the handshake, no byte ever comes
        listeners.append(listener)
    yield listeners[0].getsockname()[1], listeners[1].getsockname()[1]
    for listener in listeners:
        listener.close()


def serve(env: dict[str, str], **overrides: str) -> GatewayProcess:
    return GatewayProcess({**env, **overrides}).wait_ready()


def test_healthz_is_liveness_and_readyz_reports_postgres_and_redis(anonymous: httpx.Client) -> None:
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    ready = anonymous.get("/readyz")  # no token, like /healthz: probes carry none
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "postgres": "ok", "redis": "ok"}
    document = anonymous.get("/openapi.json").json()
    readyz = document["paths"]["/readyz"]["get"]
    assert set(readyz["responses"]) == {"200", "503"} and readyz["security"] == []


def test_with_redis_down_a_turn_is_stored_and_answered_202_unsent(gateway_env: dict[str, str]) -> None:
    gateway = serve(gateway_env, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    turn_id = None
    try:
        with httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
            assert api.get("/healthz").json() == {"status": "ok"}  # alive: restarting it would not help
            ready = api.get("/readyz")
            assert ready.status_code == 503
            body = ready.json()
            assert (body["status"], body["postgres"], body["error"]) == (
                "not ready",
                "ok",
                "not ready: Redis does not answer",
            )
            assert body["redis"].startswith("error: ")

            session = api.post("/sessions", json={"model": STUB_MODEL})
            assert session.status_code == 201, session.text
            submitted = api.post(f"/sessions/{session.json()['session_id']}/turns", json={"content": "stored anyway"})
            assert submitted.status_code == 202, submitted.text
            assert submitted.json()["sent"] is False and submitted.json()["created"] is True
            turn_id = uuid.UUID(submitted.json()["turn_id"])
            with session_scope() as db:
                stored = db.execute(
                    select(Turn.status, ChatMessage.content)
                    .join(ChatMessage, ChatMessage.turn_id == Turn.id)
                    .where(Turn.id == turn_id)
                ).one()
            assert (stored.status.value, stored.content) == ("queued", "stored anyway")
            assert api.get(f"/turns/{turn_id}").json()["status"] == "queued"
            # The event stream needs Redis: a clear 503, not a hang.
            stream = api.get(f"/turns/{turn_id}/events")
            assert stream.status_code == 503 and "Redis" in stream.json()["error"]
    finally:
        gateway.stop()
        if turn_id is not None:
            cancel_turn(turn_id)  # the sweeper would otherwise send it to the next test's worker


def test_readyz_names_postgres_when_it_is_down(gateway_env: dict[str, str]) -> None:
    gateway = serve(gateway_env, DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/chatq")
    try:
        ready = httpx.get(f"{gateway.base_url}/readyz", timeout=30)
        assert ready.status_code == 503
        body = ready.json()
        assert (body["postgres"], body["redis"]) == ("error: OperationalError", "ok")
        assert body["error"] == "not ready: Postgres does not answer"
        assert "postgresql+psycopg" not in ready.text  # no internals to anonymous callers
    finally:
        gateway.stop()


def test_readyz_answers_even_when_both_services_hang(
    gateway_env: dict[str, str], silent_ports: tuple[int, int]
) -> None:
    pg_port, redis_port = silent_ports
    gateway = serve(
        gateway_env,
        DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/chatq",
        REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
    )
    try:
        # Three probes in a row: later ones answer alike while the first ones' abandoned checks still wait.
        for _ in range(3):
            ready = httpx.get(f"{gateway.base_url}/readyz", timeout=30)
            assert ready.status_code == 503
            assert ready.json() == {
                "status": "not ready",
                "postgres": "no answer within 2s",
                "redis": "no answer within 2s",
                "error": "not ready: Postgres and Redis do not answer",
            }
        assert httpx.get(f"{gateway.base_url}/healthz", timeout=30).json() == {"status": "ok"}
    finally:
        gateway.stop()

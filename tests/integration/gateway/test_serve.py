"""`chatq serve` as an operator runs it: refuses to start open, serves open only on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.gateway.conftest import GatewayProcess
from tests.support.workers import ROOT
from worker.gateway.server import GRACEFUL_SHUTDOWN_SECONDS

# Each test runs a `chatq serve` subprocess.
pytestmark = pytest.mark.slow


def serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`chatq serve` that is expected to stop at once."""
    clean = {k: v for k, v in os.environ.items() if k != "CHATQ_API_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "serve", "--port", "1", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("chatq: error: ")
    return lines[0]


def test_serve_refuses_to_start_without_a_token(chatq_env: dict[str, str]) -> None:
    line = one_error_line(serve(chatq_env))
    assert "CHATQ_API_TOKEN" in line and "--unauthenticated" in line


def test_serve_refuses_a_short_token_without_showing_it(chatq_env: dict[str, str]) -> None:
    line = one_error_line(serve({**chatq_env, "CHATQ_API_TOKEN": "hunter2"}))
    assert "shorter than 16" in line and "hunter2" not in line


def test_serve_refuses_to_run_open_on_a_public_address(chatq_env: dict[str, str]) -> None:
    line = one_error_line(serve(chatq_env, "--unauthenticated", "--host", "0.0.0.0"))
    assert "loopback" in line


def test_serve_refuses_bad_gateway_settings(chatq_env: dict[str, str]) -> None:
    token = {"CHATQ_API_TOKEN": "t" * 32}
    line = one_error_line(serve({**chatq_env, **token, "CHATQ_SSE_HEARTBEAT": "often"}))
    assert "CHATQ_SSE_HEARTBEAT" in line
    line = one_error_line(serve({**chatq_env, **token, "CHATQ_API_MAX_BODY_BYTES": "-5"}))
    assert "CHATQ_API_MAX_BODY_BYTES" in line


def test_serve_help_lists_the_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for option in ("--host", "--port", "--unauthenticated"):
        assert option in result.stdout


@pytest.mark.slow
def test_an_unauthenticated_gateway_serves_localhost_only(chatq_env: dict[str, str]) -> None:
    clean = {k: v for k, v in chatq_env.items() if k != "CHATQ_API_TOKEN"}
    gateway = GatewayProcess({**clean, "CHATQ_API_TOKEN": ""}, "--unauthenticated").wait_ready()
    try:
        with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
            created = client.post("/sessions", json={"model": "echo"})
            assert created.status_code == 201
            session_id = created.json()["session_id"]
            response = client.post(f"/sessions/{session_id}/turns", json={"content": "hi"})
            assert response.status_code == 202
            # A page on another site that resolves its own name to 127.0.0.1 (DNS rebinding) is refused.
            rebound = client.get("/healthz", headers={"Host": "attacker.example:8000"})
            assert rebound.status_code == 403
            assert "localhost" in rebound.json()["error"]
            assert client.get("/healthz", headers={"Host": f"localhost:{gateway.port}"}).status_code == 200
        assert "WITHOUT authentication" in gateway.log()
    finally:
        gateway.stop()


@pytest.mark.slow
def test_sigterm_with_open_event_streams_shuts_down_promptly(chatq_env: dict[str, str]) -> None:
    token = "t" * 32
    gateway = GatewayProcess({**chatq_env, "CHATQ_API_TOKEN": token, "CHATQ_SSE_HEARTBEAT": "0.5"}).wait_ready()
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
            session_id = client.post("/sessions", json={"model": "echo"}).json()["session_id"]
            with client.stream("GET", f"/sessions/{session_id}/events") as response:
                lines = response.iter_lines()
                assert next(lines) == "retry: 1000"
                started = time.monotonic()
                gateway.process.send_signal(signal.SIGTERM)
                for _line in lines:  # the stream ends cleanly (a cut one would raise here)
                    assert time.monotonic() - started < 15
                assert time.monotonic() - started < 2
        # uvicorn re-raises the signal once it has shut down, as the default handler would.
        assert gateway.process.wait(15) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < GRACEFUL_SHUTDOWN_SECONDS
        assert "timeout graceful shutdown exceeded" not in gateway.log()
    finally:
        gateway.stop()

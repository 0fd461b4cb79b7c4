"""Fixtures for gateway tests: a real `chatq serve` subprocess next to a real worker, and HTTP clients."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.worker.conftest import STUB_MODEL, worker_env
from tests.support.workers import ROOT, WorkerProcess, shared_worker

__all__ = ["STUB_MODEL", "TOKEN", "GatewayProcess", "worker", "worker_env"]

TOKEN = "gw-test-" + secrets.token_hex(16)
"""The bearer token of the test gateway."""

MAX_BODY = 65_536
"""CHATQ_API_MAX_BODY_BYTES of the test gateway (small, so 413 is cheap to provoke)."""

HEARTBEAT = 0.5
"""CHATQ_SSE_HEARTBEAT of the test gateway."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class GatewayProcess:
    """`chatq serve` in a subprocess with its own log file."""

    def __init__(self, env: dict[str, str], *args: str, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.port = port or free_port()
        self.base_url = f"http://{host}:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="chatq-gateway-")) / "gateway.log"
        command = [sys.executable, "-m", "worker.cli", "serve", "--host", host, "--port", str(self.port), *args]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chatq serve exited at start:\n{self.log()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"chatq serve did not answer:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        """kill -9: the gateway dies with its streams open, as in a crash."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture(scope="package")
def worker(worker_env: dict[str, str]) -> Iterator[WorkerProcess]:
    """One real `chatq worker` shared by the gateway tests."""
    yield from shared_worker(worker_env)


@pytest.fixture(scope="session")
def gateway_env(worker_env: dict[str, str]) -> dict[str, str]:
    """The gateway's environment: the test database, Redis db and model stub, a token, small limits."""
    return {
        **worker_env,
        "CHATQ_API_TOKEN": TOKEN,
        "CHATQ_API_MAX_BODY_BYTES": str(MAX_BODY),
        "CHATQ_SSE_HEARTBEAT": str(HEARTBEAT),
    }


@pytest.fixture(scope="session")
def gateway(gateway_env: dict[str, str]) -> Iterator[GatewayProcess]:
    """One `chatq serve` shared by the gateway tests."""
    process = GatewayProcess(gateway_env).wait_ready()
    yield process
    process.stop()


@pytest.fixture
def api(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    """An HTTP client of the test gateway that sends the token."""
    with httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        yield client


@pytest.fixture
def anonymous(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    """An HTTP client of the test gateway without a token."""
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        yield client

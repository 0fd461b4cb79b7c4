"""Ctrl-C stops `chatq worker` (and `make run`) cleanly: exit status 0, no `make: *** ... Error 1`.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group; the tests do the same to a
process group of their own. Celery's first SIGINT is a warm shutdown, like SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.workers import ROOT, TEST_ENV

pytestmark = pytest.mark.slow


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **TEST_ENV, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _interrupt_when_ready(process: subprocess.Popen[bytes], log: Path, *, timeout: float = 60.0) -> int:
    """Wait for Celery's ready line, press Ctrl-C (SIGINT to the group), return the exit status."""
    deadline = time.monotonic() + timeout
    try:
        while " ready." not in log.read_text(errors="replace"):
            assert process.poll() is None, f"exited at start:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        return process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def test_chatq_worker_exits_0_on_ctrl_c(chatq_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = _start(
        [sys.executable, "-m", "worker.cli", "worker", "--without-gossip", "--without-mingle"], chatq_env, log
    )
    status = _interrupt_when_ready(worker, log)
    assert status == 0, log.read_text()[-3000:]
    assert "Warm shutdown" in log.read_text()


def test_chatq_worker_still_exits_0_on_sigterm(chatq_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = _start(
        [sys.executable, "-m", "worker.cli", "worker", "--without-gossip", "--without-mingle"], chatq_env, log
    )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text(errors="replace"):
        assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_ends_without_an_error_line_on_ctrl_c(chatq_env: dict[str, str], tmp_path: Path) -> None:
    """The real `run` recipe, minus its set-up: `-o migrate` skips install/services/migrate (the test's
    database is migrated already) and WITH_ENV= keeps the test's URLs instead of .local/services.env."""
    log = tmp_path / "make.log"
    command = ["make", "--no-print-directory", "-o", "migrate", "run", "WITH_ENV=", f"VENV={sys.prefix}"]
    make = _start(command, chatq_env, log)
    status = _interrupt_when_ready(make, log)
    output = log.read_text()
    assert "make: ***" not in output, output[-3000:]
    assert "Warm shutdown" in output
    # make passes the interrupt on to whoever ran it (ends by SIGINT itself) unless its recipe failed.
    assert status in (0, -signal.SIGINT), output[-3000:]
    # What it told its user first: where the services are.
    assert output.startswith("chatq: Postgres ")

"""`chatq worker` refusing to start: what it says, and that it stops instead of restarting forever."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support.cli import chatq
from tests.support.workers import ROOT, TEST_ENV
from worker.cli.node_names import hold_name

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", ["2", "1"])
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("raise RuntimeError('boom while importing')\n", "(RuntimeError: boom while importing)"),
        (None, "(No module named 'chatq_test_plugin')"),
    ],
    ids=["raises", "missing"],
)
def test_a_plugin_that_cannot_be_imported_stops_the_service_with_one_line(
    worker_env: dict[str, str], tmp_path: Path, processes: str, source: str | None, reason: str
) -> None:
    if source is not None:
        (tmp_path / "chatq_test_plugin.py").write_text(source)
    env = {
        **worker_env,
        **TEST_ENV,
        "CHATQ_PLUGINS": "chatq_test_plugin",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    started = time.monotonic()
    try:
        # Before: every Celery process printed a traceback and the supervisor started it again, forever.
        result = chatq(env, "worker", "--processes", processes, "--concurrency", "1", timeout=40)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"chatq worker kept running:\n{str(exc.stderr or '')[-3000:]}") from None
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines() == [f"chatq: error: CHATQ_PLUGINS: cannot import 'chatq_test_plugin' {reason}."]
    assert time.monotonic() - started < 30


def test_a_second_single_worker_under_a_held_node_name_is_refused_in_one_line(worker_env: dict[str, str]) -> None:
    name = f"single-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    held = hold_name(name)  # as a running `chatq worker --processes 1 --hostname NAME` holds it
    assert held is not None
    try:
        # Before: a second Celery node under the same name started (Celery only warns, in `celery status`).
        result = chatq({**worker_env, **TEST_ENV}, "worker", "--processes", "1", "--hostname", name, timeout=40)
    except subprocess.TimeoutExpired:
        raise AssertionError("a second worker under a held node name started") from None
    finally:
        held.close()
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"chatq: error: {name} already runs on this host (another chatq worker); give this one its own --hostname"
    ]

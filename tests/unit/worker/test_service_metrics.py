"""The metrics directory of a `chatq worker` service (worker/ops/service_metrics.py): fresh per service,
and what a service killed with -9 left behind is removed by the next one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from worker.ops.service_metrics import DIRECTORY_PREFIX, remove_stale_directories


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_directories_of_supervisors_that_no_longer_run_are_removed() -> None:
    root = Path(tempfile.gettempdir())
    stale = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{_dead_pid()}-", dir=root))
    (stale / "counter_123.db").write_bytes(b"\0" * 8)
    live = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-", dir=root))
    try:
        remove_stale_directories()
        assert not stale.exists()
        assert live.is_dir()
    finally:
        for path in (stale, live):
            shutil.rmtree(path, ignore_errors=True)

"""Running the `chatq` command line as a user would: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.workers import ROOT


def chatq(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `chatq ARGS...` with `env` added to this process's environment; never raises on failure."""
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )

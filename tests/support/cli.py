"""Running the `chatq` command line as a user would: a real subprocess, or its `main` in this process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

from tests.support.env import environ
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


def chatq_here(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`chatq ARGS...` as `chatq` above, but its `main` in this process (what `python -m worker.cli`
    runs: `sys.exit(main())`), stdout and stderr captured: the same exit code and output without
    an interpreter start-up (about a CPU-second each). For tests about what a command says and
    does; what only a process has (its start, signals) keeps `chatq`."""
    from worker.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    with environ(**env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else 0
    return subprocess.CompletedProcess(["chatq", *args], code, out.getvalue(), err.getvalue())

"""Real Celery workers (`chatq worker`) started as subprocesses for integration and fault tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Fast failure detection for tests; production defaults are documented in README.
TEST_ENV = {
    "CHATQ_LEASE_SECONDS": "3",
    "CHATQ_RETRY_DELAY": "0.2",
    "CHATQ_TURN_TIMEOUT": "20",
    "CHATQ_REQUEUE_GRACE": "3",
    "CHATQ_SWEEP_INTERVAL": "1",
    # Off unless a test is about it (tests/faults/test_worker_sweeps.py): test workers share one
    # database per run, and a worker sweeping every second would pick up the turns other tests
    # leave queued on purpose and run them ahead of its own test's turns.
    "CHATQ_WORKER_SWEEP": "off",
    "PYTHONUNBUFFERED": "1",
}


_launched: list[WorkerProcess] = []

launches: Counter[str] = Counter()
"""Real worker start-ups per test file (a start-up costs ~2.5 CPU-seconds; tests/conftest.py
prints them at the end of a run without pytest-xdist, to see where a run's CPU goes)."""


class _RunningTest:
    """The test being set up or run (tests/conftest.py sets it before its fixtures)."""

    item: Any = None


running_test = _RunningTest()


def live_workers() -> list[WorkerProcess]:
    """The real workers this test process started that still run."""
    return [worker for worker in _launched if worker.alive]


class ManagedProcess:
    """A `chatq` subprocess in its own process group, writing to its own log file."""

    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        """Everything the process printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9 the whole process group (main process and any children)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


class WorkerProcess(ManagedProcess):
    """One `chatq worker` with its own log file.

    `processes=1` (the default here) makes it one Celery worker in one process, which the tests
    that kill or signal "the worker" by its pid rely on; more makes it the supervised service of
    worker/cli/supervisor.py (tests/integration/worker/test_supervisor.py).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        concurrency: int = 4,
        queues: str = "chatq,chatq.batch,chatq.webhooks",
        name: str | None = None,
        extra: tuple[str, ...] = (),
        processes: int = 1,
    ) -> None:
        self.name = name or f"test-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, **TEST_ENV, **env}
        self.concurrency = concurrency
        self.queues = queues
        self.extra = extra
        self.processes = processes
        self.log_offset = 0
        self.log_path = Path(tempfile.mkdtemp(prefix="chatq-worker-")) / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def launch(self) -> WorkerProcess:
        """Start the process without waiting (several can start in parallel); `wait_ready` waits."""
        item = running_test.item
        if item is not None and item.get_closest_marker("slow") is None:
            # `make test-fast` leaves out the tests marked slow: one that starts a worker must be.
            raise RuntimeError(f"{item.nodeid} starts a real worker: mark it (or its module) slow")
        command = [
            sys.executable,
            "-m",
            "worker.cli",
            "worker",
            "--hostname",
            f"{self.name}@%h",
            "--concurrency",
            str(self.concurrency),
            "--queues",
            self.queues,
            "--without-gossip",
            "--without-mingle",
            "--processes",
            str(self.processes),
            *self.extra,
        ]
        # Appended: a worker restarted under the same name keeps its earlier log.
        self.log_offset = len(self.log())
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        _launched.append(self)
        launches[item.path.relative_to(ROOT).as_posix() if item is not None else "(no test)"] += 1
        return self

    def wait_ready(self, *, timeout: float = 60.0) -> WorkerProcess:
        """Wait until Celery says the worker is ready."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited at start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"worker {self.name} did not become ready:\n{self.log()[-4000:]}")

    def _ready(self) -> bool:
        if self.processes == 1:
            # As the tests were written: any "ready." line in the log, also one of an earlier
            # start under this name (tests that restart the package's worker rely on it).
            return " ready." in self.log()
        # The supervised service: one "ready." line per process, counted from this start on.
        return self.log()[self.log_offset :].count(" ready.") >= self.processes

    def start(self, *, timeout: float = 60.0) -> WorkerProcess:
        """Start the worker and wait until Celery says it is ready."""
        return self.launch().wait_ready(timeout=timeout)

    @property
    def hostname_prefix(self) -> str:
        """What `turns.worker` starts with for turns this worker claimed (its processes' node
        names are `name-1@host`, `name-2@host`, ... when it runs several)."""
        return f"{self.name}@" if self.processes == 1 else f"{self.name}-"

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def shared_worker(env: Mapping[str, str]) -> Iterator[WorkerProcess]:
    """A real worker for a package's or module's `worker` fixture: started, yielded, stopped."""
    process = WorkerProcess(env, concurrency=6).start()
    yield process
    process.stop()

"""`chatq worker` on every core: N Celery worker processes supervised as one service.

One Celery worker is one interpreter, so its turns' CPU queues for one interpreter lock while the
other cores idle. `chatq worker` therefore starts one Celery worker (thread pool) per core it may
run on, each under its own node name (`name-1@host`, `name-2@host`, ...: leases, `turns.worker` and
the poison rule tell the processes apart, and the host part stays the machine's), and:

- forwards the first SIGTERM or SIGINT to every child as SIGTERM (the warm shutdown: running
  turns are handed back, worker/ops/stopping.py) and one that comes `ESCALATION_GRACE` seconds or
  more later as SIGQUIT (cold shutdown); its handler only records the signal, the loop forwards it.
  A Ctrl-C reaches the children both from the terminal and from here: they take both as one request;
- starts a child again when it dies while the service runs (after 1 s, doubling up to 30 s while
  it keeps dying within its first 10 s);
- stops every child and exits with the child's status when a child rejects its options;
- exits 0 after a requested shutdown in which no child failed (as one Celery worker does).

Children ignore SIGINT until Celery installs its own handlers, so a Ctrl-C (which the terminal
sends to the whole process group) never interrupts a child's imports; the supervisor's SIGTERM
stops such a child at once, and it held no turn yet. On Linux a child is sent SIGTERM if the
supervisor itself dies (`PR_SET_PDEATHSIG`), so no worker outlives its service.
`--processes 1` runs one Celery worker in this process instead, as before (for an outside
supervisor: systemd, Kubernetes).

What the children share is set up around the supervisor (worker/cli/service.py) and handed in: their
environment (`env`: the metrics directory of worker/ops/service_metrics.py, whose endpoint serves
every child) and what to do when one ends (`on_exit`); their node names are free on this host
(worker/cli/node_names.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from types import FrameType

from worker.errors import CliError

HOSTNAME_OPTIONS = ("--hostname", "-n")
PROCESSES_OPTION = "--processes"
USAGE_EXIT_CODES = frozenset({2, 64})
"""argparse's and Celery's (EX_USAGE) status for bad options: starting again cannot help."""
QUICK_DEATH = 10.0
"""A child that dies sooner than this after its start is backed off before the next start."""
MAX_BACKOFF = 30.0
POLL_INTERVAL = 0.1
ESCALATION_GRACE = 3.0
"""A stop signal this many seconds or more after the first is forwarded as SIGQUIT (cold); as the
children's own grace (worker/ops/stopping.py), so a Ctrl-C's two copies never escalate."""
_PR_SET_PDEATHSIG = 1


def default_processes() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def take_processes(arguments: Sequence[str]) -> tuple[int | None, list[str]]:
    """`--processes N` / `--processes=N` taken out of a worker's arguments: (N or None, the rest)."""
    rest: list[str] = []
    processes: int | None = None
    items = list(arguments)
    index = 0
    while index < len(items):
        item = items[index]
        value: str | None = None
        if item == PROCESSES_OPTION:
            if index + 1 >= len(items):
                raise CliError("--processes needs a number (worker processes to run, at least 1)")
            value = items[index + 1]
            index += 2
        elif item.startswith(PROCESSES_OPTION + "="):
            value = item.split("=", 1)[1]
            index += 1
        else:
            rest.append(item)
            index += 1
            continue
        if not value.isdigit() or int(value) < 1:
            raise CliError(f"--processes must be a whole number of at least 1, not {value!r}")
        processes = int(value)
    return processes, rest


def child_hostname(base: str, index: int) -> str:
    """The node name of child `index` (1-based): `-index` added to the name part of `name@host`."""
    name, at, host = base.partition("@")
    return f"{name}-{index}{at}{host}"


def child_arguments(arguments: Sequence[str], index: int) -> list[str]:
    """A child's Celery worker arguments: the given ones, with its own node name."""
    items = list(arguments)
    for position, item in enumerate(items):
        if item in HOSTNAME_OPTIONS and position + 1 < len(items):
            return [*items[:position], item, child_hostname(items[position + 1], index), *items[position + 2 :]]
        for option in HOSTNAME_OPTIONS:
            if item.startswith(option + "=") and option.startswith("--"):
                value = item.split("=", 1)[1]
                return [*items[:position], f"{option}={child_hostname(value, index)}", *items[position + 1 :]]
    return [*items, "--hostname", child_hostname("celery@%h", index)]


def _child_setup() -> None:
    """In the child, before exec: ignore Ctrl-C until Celery installs its handlers; die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


@dataclass(kw_only=True)
class Child:
    """One supervised worker process."""

    index: int
    """Its slot, 1-based (part of its node name)."""
    command: list[str]
    """What starts it."""
    process: subprocess.Popen[bytes] | None = None
    """The running process, if any."""
    started_at: float = 0.0
    """time.monotonic() of its last start."""
    starts: int = 0
    """How often it was started."""
    backoff: float = 1.0
    """Seconds before the next start after a quick death."""
    due_at: float | None = None
    """time.monotonic() of its next start, while it waits for one."""


@dataclass(kw_only=True)
class Supervisor:
    """Runs the children until a signal stops them (`run`)."""

    commands: list[list[str]]
    """One command per child."""
    env: Mapping[str, str] | None = None
    """The children's environment (None: this process's)."""
    on_exit: Callable[[int], None] | None = None
    """Called with the pid of each child that ended (the service's metrics drop its live gauges)."""
    children: list[Child] = field(default_factory=list)
    stopping: int = 0
    """Shutdown forwarded: 0 running, 1 warm shutdown, 2 cold."""
    stop_requests: SimpleQueue[int] = field(default_factory=SimpleQueue)
    """Signals received, recorded by the handler (a reentrant `put`) and forwarded by the loop."""
    first_stop_at: float = 0.0
    """time.monotonic() of the warm shutdown's forwarding."""

    def __post_init__(self) -> None:
        self.children = [Child(index=i, command=c) for i, c in enumerate(self.commands, start=1)]

    def _say(self, message: str) -> None:
        sys.stderr.write(f"chatq worker: {message}\n")
        sys.stderr.flush()

    def _start(self, child: Child) -> None:
        # preexec_fn is safe beside the metrics endpoint's thread: that thread took no lock the
        # child's setup needs (it imported what it uses before the first child started).
        child.process = subprocess.Popen(child.command, env=self.env, preexec_fn=_child_setup)  # noqa: PLW1509
        child.started_at = time.monotonic()
        child.starts += 1
        child.due_at = None
        if self.stopping:  # a signal came while the children were being started
            child.process.send_signal(signal.SIGTERM)

    def _signal_children(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signum)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only record: a handler can run inside another one (or inside the loop's Popen calls).
        self.stop_requests.put_nowait(signum)

    def _forward_stop_requests(self) -> None:
        """Warm first (hand back, exit), cold when asked again after the grace."""
        while True:
            try:
                self.stop_requests.get_nowait()
            except Empty:
                return
            now = time.monotonic()
            if not self.stopping:
                self.stopping, self.first_stop_at = 1, now
                self._signal_children(signal.SIGTERM)
            elif self.stopping == 1 and now - self.first_stop_at >= ESCALATION_GRACE:
                self.stopping = 2
                self._signal_children(signal.SIGQUIT)

    def run(self) -> int:
        """Start every child, supervise them, and return the service's exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        for child in self.children:
            self._forward_stop_requests()
            self._start(child)
        pids = ", ".join(str(c.process.pid) for c in self.children if c.process)
        self._say(f"started {len(self.children)} worker processes (pids {pids}); --processes N changes the count")
        failed: int | None = None
        while True:
            self._forward_stop_requests()
            now = time.monotonic()
            for child in self.children:
                if child.process is None:
                    if not self.stopping and child.due_at is not None and now >= child.due_at:
                        self._start(child)
                        assert child.process is not None
                        self._say(f"process {child.index} started again (pid {child.process.pid})")
                    continue
                status = child.process.poll()
                if status is None:
                    continue
                pid, child.process = child.process.pid, None
                if self.on_exit is not None:
                    self.on_exit(pid)
                if self.stopping:
                    if status not in (0, -signal.SIGTERM, -signal.SIGINT) and failed is None:
                        failed = status
                    continue
                if status in USAGE_EXIT_CODES:
                    self._say(f"process {child.index} rejected its options (exit {status}); stopping")
                    self.stopping = 1
                    self._signal_children(signal.SIGTERM)
                    failed = status
                    continue
                if now - child.started_at >= QUICK_DEATH:
                    child.backoff = 1.0
                delay = child.backoff
                child.backoff = min(child.backoff * 2, MAX_BACKOFF)
                child.due_at = now + delay
                self._say(f"process {child.index} (pid {pid}) exited with status {status}; starting it in {delay:g} s")
            if self.stopping and all(c.process is None for c in self.children):
                break
            time.sleep(POLL_INTERVAL)
        if failed is None:
            return 0
        return failed if failed > 0 else 1

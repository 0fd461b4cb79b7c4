"""What every benchmark shares: isolated services, the stub process, workers, event capture, reporting.

Each benchmark runs in its own Python process (`python -m bench NAME`), so the environment it sets
(DATABASE_URL, REDIS_URL, OPENAI_BASE_URL) is read fresh by chatq's lazily built settings, engine,
Redis client and Celery app. Everything started here is stopped in `finally` blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BENCH_API_KEY = "sk-bench-not-a-secret"


# --- results -------------------------------------------------------------------------------------


@dataclass
class Block:
    """One benchmark figure: what it is, the same-run baseline, the ratio and the verdict."""

    name: str
    """Short id, e.g. `io_concurrency.10s`."""
    target: str
    """The target in words, e.g. `span <= 1.11x ideal`."""
    figure: float
    baseline: float
    unit: str
    limit: float | None
    """Ratio limit (figure / baseline must be <= limit); None: informational, no verdict."""
    baseline_label: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    higher_is_better: bool = False
    withheld: str = ""
    """When set (e.g. `NOT PUBLISHABLE (load 2.31)`), the figure is not to be published: this is its verdict."""

    @property
    def ratio(self) -> float:
        if self.baseline == 0:
            return float("inf")
        return self.figure / self.baseline

    @property
    def verdict(self) -> str:
        if self.withheld:
            return self.withheld
        if self.limit is None:
            return "info"
        if self.higher_is_better:
            return "meets" if self.ratio >= self.limit else "MISSES"
        return "meets" if self.ratio <= self.limit else "MISSES"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "figure": self.figure,
            "baseline": self.baseline,
            "baseline_label": self.baseline_label,
            "unit": self.unit,
            "ratio": self.ratio,
            "limit": self.limit,
            "verdict": self.verdict,
            "details": self.details,
        }


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "MiB":
        return f"{value:.2f} MiB"
    return f"{value:.4g} {unit}".strip()


def print_block(block: Block) -> None:
    """One clear block per figure."""
    print(f"\n== {block.name}", flush=True)
    print(f"   target   : {block.target}")
    print(f"   figure   : {fmt(block.figure, block.unit)}")
    label = f"  ({block.baseline_label})" if block.baseline_label else ""
    print(f"   baseline : {fmt(block.baseline, block.unit)}{label}")
    print(f"   ratio    : {block.ratio:.3f}x" + (f"  (limit {block.limit:g}x)" if block.limit is not None else ""))
    print(f"   verdict  : {block.verdict}")
    for key, value in block.details.items():
        print(f"   {key:<9}: {value}")
    sys.stdout.flush()


def report(blocks: list[Block], results: list[dict[str, Any]], json_path: str | None) -> int:
    """A benchmark module's own command line ends here: its blocks printed, its raw results written
    to `json_path` when given; returns the exit code."""
    for block in blocks:
        print_block(block)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def log(message: str) -> None:
    print(f"   .. {message}", flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- services ------------------------------------------------------------------------------------


@contextlib.contextmanager
def isolated_services(label: str) -> Iterator[dict[str, str]]:
    """A throw-away migrated database and a private Redis db; chatq in this process points at them."""
    from tests.support.services import fresh_database, private_redis_db

    with private_redis_db() as redis_url, fresh_database(f"chatq_bench_{label}") as database_url:
        os.environ["DATABASE_URL"] = database_url
        os.environ["REDIS_URL"] = redis_url
        _reset_chatq()
        try:
            yield {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
        finally:
            _reset_chatq()


def _reset_chatq() -> None:
    from chatq.settings import reset_settings
    from models.db import dispose_engine
    from worker.events import reset_redis

    reset_settings()
    dispose_engine()
    reset_redis()


def use_stub(base_url: str) -> None:
    """Point this process's chatq at the stub (the workers get the same through their env)."""
    from chatq.settings import reset_settings

    os.environ["OPENAI_BASE_URL"] = base_url
    os.environ["OPENAI_API_KEY"] = BENCH_API_KEY
    reset_settings()


# --- processes -----------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_status(pid: int, key: str) -> int:
    """A /proc/<pid>/status field in kB (VmRSS, VmHWM) or a count (Threads)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, all its threads, in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Subprocess:
    """A child process in its own process group, with a log file; killed (group) on stop."""

    def __init__(
        self, name: str, command: list[str], env: Mapping[str, str], ready: str | None, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.cwd = cwd
        self.command = command
        self.env = dict(env)
        self.ready = ready
        self.log_path = Path(tempfile.mkdtemp(prefix="chatq-bench-")) / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> Subprocess:
        out = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while self.ready is not None:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log()[-3000:]}")
            if self.ready in self.log():
                break
            if time.monotonic() > deadline:
                tail = self.log()[-3000:]
                self.stop()
                raise RuntimeError(f"{self.name} not ready in {timeout:.0f}s:\n{tail}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, then SIGKILL what is left; the log goes too (CHATQ_BENCH_KEEP_LOGS=1 keeps it)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        if not os.environ.get("CHATQ_BENCH_KEEP_LOGS"):
            shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def __enter__(self) -> Subprocess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Stub(Subprocess):
    """bench.stub in its own process; its CPU is never counted as chatq's."""

    def __init__(self, *, latency: float = 0.0, chunk_interval: float = 0.0) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.stub",
            "--latency",
            str(latency),
            "--chunk-interval",
            str(chunk_interval),
        ]
        super().__init__("stub", command, os.environ, ready="http://")
        self.base_url = ""

    def start(self, timeout: float = 30.0) -> Stub:
        super().start(timeout)
        self.base_url = self.log().strip().splitlines()[0]
        return self

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/_stats", timeout=5) as response:
            data: dict[str, int] = json.loads(response.read())
            return data

    def reset_stats(self) -> None:
        request = urllib.request.Request(self.base_url.removesuffix("/v1") + "/_stats", method="DELETE")
        with urllib.request.urlopen(request, timeout=5):
            pass


def chatq_worker(
    *, concurrency: int | None = None, env: Mapping[str, str] | None = None, name: str = "bench"
) -> Subprocess:
    """`chatq worker --processes 1` (one Celery worker, threads pool, the project's defaults) as a subprocess.

    One process: these benchmarks pause and resume its consumer by node name, read its CPU and RSS
    by pid and compare it with one bare Celery worker (bench/peer.py runs the default, one process
    per core). `--without-gossip --without-mingle` only shorten start-up (one worker per broker db).
    """
    hostname = f"{name}-{uuid.uuid4().hex[:6]}"
    # With CHATQ_BENCH_PUBLIC_API set, the shortcuts it names are off in the worker (bench.public_api).
    entry = "bench.public_api" if os.environ.get("CHATQ_BENCH_PUBLIC_API") else "worker.cli"
    command = [sys.executable, "-m", entry, "worker", "--processes", "1", "--hostname", f"{hostname}@%h"]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    command += ["--without-gossip", "--without-mingle"]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    worker = Subprocess(hostname, command, full_env, ready=" ready.")
    worker.hostname = f"{hostname}@{os.uname().nodename}"  # type: ignore[attr-defined]
    return worker


def baseline_worker(*, concurrency: int, name: str = "baseline") -> Subprocess:
    """A bare Celery worker on the same broker and pool (bench.celery_baseline)."""
    hostname = f"{name}-{uuid.uuid4().hex[:6]}"
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.celery_baseline",
        "worker",
        "--hostname",
        f"{hostname}@%h",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--queues",
        "bench",
        "--task-events",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    worker = Subprocess(hostname, command, {**os.environ, "PYTHONUNBUFFERED": "1"}, ready=" ready.")
    worker.hostname = f"{hostname}@{os.uname().nodename}"  # type: ignore[attr-defined]
    return worker


# --- stream events -------------------------------------------------------------------------------


class EventCapture:
    """Subscribes to every session channel (psubscribe) and records (receive time, event) per turn."""

    def __init__(self, pattern: str = "chatq:session:*", *, raw: bool = False) -> None:
        import redis

        self.client = redis.Redis.from_url(os.environ["REDIS_URL"])
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pattern = pattern
        self.raw = raw
        self.events: dict[str, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
        self.received: list[tuple[float, bytes]] = []
        self._done: dict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-capture", daemon=True)

    def __enter__(self) -> EventCapture:
        self.pubsub.psubscribe(self.pattern)
        # Wait for the subscription to be active before anything is published.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(ignore_subscribe_messages=False, timeout=0.5)
            if message and message["type"] == "psubscribe":
                break
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message is None:
                continue
            now = time.time()
            data = message["data"]
            if self.raw:
                self.received.append((now, data))
                continue
            event = json.loads(data)
            turn = event.get("turn_id", "")
            with self._lock:
                self.events[turn].append((now, event))
            if event.get("type") in ("final", "error", "cancelled"):
                self._done[turn].set()

    def wait(self, turn_id: object, timeout: float) -> bool:
        return self._done[str(turn_id)].wait(timeout)

    def wait_all(self, turn_ids: Sequence[object], timeout: float) -> int:
        """Wait for every turn's terminal event; returns how many ended."""
        deadline = time.monotonic() + timeout
        ended = 0
        for turn in turn_ids:
            if self._done[str(turn)].wait(max(deadline - time.monotonic(), 0)):
                ended += 1
        return ended

    def of(self, turn_id: object) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return list(self.events.get(str(turn_id), []))


# --- sampling ------------------------------------------------------------------------------------


class Sampler:
    """Calls `probe()` every `interval` seconds on a thread and keeps the results."""

    def __init__(self, probe: Callable[[], dict[str, float]], interval: float = 0.1) -> None:
        self.probe = probe
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append({"t": time.time(), **self.probe()})
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def peak(self, key: str) -> float:
        return max((s[key] for s in self.samples if key in s), default=0.0)


# --- chatq helpers -------------------------------------------------------------------------------


def new_session_info(model: str) -> Any:
    """A `SessionInfo` for an in-process handler call: a new empty session, no knowledge bases."""
    from handlers.base import SessionInfo

    return SessionInfo(
        id=uuid.uuid4(), agent_framework="langgraph", model=model, system_prompt=None, metadata_={}, knowledge_bases=()
    )


def create_sessions(count: int, *, model: str, framework: str = "langgraph") -> list[uuid.UUID]:
    from worker.producer import create_session

    return [create_session(framework=framework, model=model) for _ in range(count)]


def turn_statuses(turn_ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """How many of these turns are in each status."""
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        rows = db.execute(select(Turn.status, func.count()).where(Turn.id.in_(list(turn_ids))).group_by(Turn.status))
        return {str(status.value): int(count) for status, count in rows}


def wait_finished(turn_ids: Sequence[uuid.UUID], timeout: float, poll: float = 0.2) -> dict[str, int]:
    """Poll Postgres until every turn has finished (or the timeout); returns the status counts."""
    deadline = time.monotonic() + timeout
    while True:
        counts = turn_statuses(turn_ids)
        unfinished = counts.get("queued", 0) + counts.get("running", 0)
        if unfinished == 0 and sum(counts.values()) == len(turn_ids):
            return counts
        if time.monotonic() > deadline:
            return counts
        time.sleep(poll)


def run_warmup(capture: EventCapture | None, models: Sequence[str], turns_each: int = 3) -> None:
    """A few turns per model so clients, graphs and pools exist before anything is measured."""
    from worker.producer import submit_turn

    ids = []
    for model in models:
        for session_id in create_sessions(turns_each, model=model):
            ids.append(submit_turn(session_id, "warm up").turn_id)
    counts = wait_finished(ids, timeout=60)
    if counts.get("succeeded", 0) != len(ids):
        raise RuntimeError(f"warm-up turns did not all succeed: {counts}")


def log_count(worker: Subprocess, needle: str) -> int:
    return worker.log().count(needle)


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "worker", "models", "handlers", "celeryconfig.py"],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --- round trips ---------------------------------------------------------------------------------


def redis_commandstats() -> dict[str, int]:
    """Redis `INFO commandstats` calls per command (server-wide: exact only with private services)."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


def redis_delta(before: dict[str, int], after: dict[str, int], per: int) -> str:
    """Commands per turn between two `redis_commandstats()` readings, busiest first."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    rows = sorted(((v, k) for k, v in delta.items() if v > 0), reverse=True)
    total = sum(v for v, _ in rows)
    return f"{total / per:.1f} commands/turn: " + ", ".join(f"{k} {v / per:.1f}" for v, k in rows[:12])


def pg_statements_reset() -> bool:
    """Reset pg_stat_statements in the benchmark database; False when the extension is unavailable."""
    from sqlalchemy import text

    from models.db import session_scope

    try:
        with session_scope() as db:
            db.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            db.execute(text("SELECT pg_stat_statements_reset()"))
        return True
    except Exception:
        return False


def pg_statements(per: int, top: int = 40) -> list[str]:
    """Statements per turn in this database since the reset, most frequent first."""
    from sqlalchemy import text

    from models.db import session_scope

    with session_scope() as db:
        rows = db.execute(
            text(
                "SELECT calls, total_exec_time, query FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND query NOT ILIKE '%pg_stat_statements%' ORDER BY calls DESC"
            )
        ).all()
    total = sum(int(r.calls) for r in rows)
    out = [
        f"{total / per:.1f} statements/turn ({sum(float(r.total_exec_time) for r in rows) / per:.2f} ms server time)"
    ]
    for r in rows[:top]:
        query = " ".join(str(r.query).split())
        out.append(f"{int(r.calls) / per:5.2f}/turn  {query[:150]}")
    return out

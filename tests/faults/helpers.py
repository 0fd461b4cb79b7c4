"""Helpers of the fault tests: beat and worker processes, service restarts, outage-tolerant reads.

Everything here acts on real processes and the machine's real Postgres and Redis. Restarts keep
their window short and every helper that stops a service has a matching `ensure_running`, which
the fixtures call at teardown whatever happened in the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from models.db import session_scope
from models.tables import ChatMessage, Turn
from tests.support.turns import FINISHED, replay_events
from tests.support.workers import ROOT, TEST_ENV, ManagedProcess, WorkerProcess

T = TypeVar("T")

STUB_MODEL = "gpt-4o-mini"
"""Sessions on this model make the worker's ChatOpenAI talk to the OpenAI stub."""

LEASE_SECONDS = float(TEST_ENV["CHATQ_LEASE_SECONDS"])
SWEEP_INTERVAL = float(TEST_ENV["CHATQ_SWEEP_INTERVAL"])
REQUEUE_GRACE = float(TEST_ENV["CHATQ_REQUEUE_GRACE"])

_DB_DOWN = (OperationalError, DBAPIError)


# --- processes --------------------------------------------------------------------------------


Worker = WorkerProcess
"""The fault tests' name for a `chatq worker` subprocess (launched without waiting, restartable)."""


class Workers:
    """Starts workers for one test and kills every one of them at teardown."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.started: list[Worker] = []

    def launch(
        self,
        *,
        concurrency: int = 4,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        processes: int = 1,
    ) -> Worker:
        """Start one worker without waiting for it (`processes` > 1: the supervised service)."""
        worker = Worker({**self.env, **(env or {})}, concurrency=concurrency, name=name, processes=processes)
        self.started.append(worker)
        return worker.launch()

    def start(
        self, count: int = 1, *, concurrency: int = 4, env: Mapping[str, str] | None = None, prefix: str = "w"
    ) -> list[Worker]:
        """Start `count` workers in parallel and wait until all are ready."""
        batch = [
            self.launch(concurrency=concurrency, env=env, name=f"{prefix}{len(self.started)}-{uuid.uuid4().hex[:6]}")
            for _ in range(count)
        ]
        for worker in batch:
            worker.wait_ready()
        return batch

    def top_up(self, count: int) -> list[Worker]:
        """Start workers until `count` of this pool's are alive; those `count`, oldest first (a
        module's tests share a pool: a start-up costs seconds of CPU)."""
        missing = count - len(self.alive)
        if missing > 0:
            self.start(missing)
        return self.alive[:count]

    def one(self, **kwargs: Any) -> Worker:
        """Start one worker and wait until it is ready."""
        return self.start(1, **kwargs)[0]

    @property
    def alive(self) -> list[Worker]:
        """The workers still running."""
        return [worker for worker in self.started if worker.alive]

    def kill_all(self) -> None:
        """kill -9 every worker this test started."""
        for worker in self.started:
            with contextlib.suppress(Exception):
                worker.kill()

    def owner_of(self, turn_id: uuid.UUID) -> Worker:
        """The worker whose claim the turn currently runs under."""
        name = read_db(lambda: _turn_worker(turn_id))
        for worker in self.started:
            if name and name.startswith(worker.hostname_prefix):
                return worker
        raise AssertionError(f"turn {turn_id} runs on {name!r}, not on a worker of this test")

    def logs(self, tail: int = 3000) -> str:
        """The end of every worker's log, for failure reports."""
        return "\n".join(f"--- worker {w.name} (alive={w.alive}) ---\n{w.log()[-tail:]}" for w in self.started)


def _turn_worker(turn_id: uuid.UUID) -> str | None:
    with session_scope() as db:
        return db.execute(select(Turn.worker).where(Turn.id == turn_id)).scalar_one_or_none()


class Beat(ManagedProcess):
    """`chatq beat` (python -m worker.cli beat) as a subprocess with a private schedule file."""

    def __init__(self, env: Mapping[str, str], directory: Path) -> None:
        self.env = {**os.environ, **TEST_ENV, **env}
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "beat.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *, timeout: float = 30.0) -> Beat:
        """Start beat and wait until it has sent its first sweep."""
        command = [
            sys.executable,
            "-m",
            "worker.cli",
            "beat",
            "--schedule",
            str(self.directory / "schedule"),
            "--pidfile",
            str(self.directory / "beat.pid"),
        ]
        offset = len(self.log())
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Sending due task" in self.log()[offset:]:
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"beat exited at start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"beat did not start:\n{self.log()[-4000:]}")


# --- reading Postgres through outages -----------------------------------------------------------


def read_db(fn: Callable[[], T], *, timeout: float = 60.0) -> T:
    """Run a read, retrying while Postgres is unreachable (a restart in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except _DB_DOWN:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def load_turns(turn_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Turn]:
    """The turn rows, by id."""
    ids = list(turn_ids)

    def query() -> dict[uuid.UUID, Turn]:
        with session_scope() as db:
            return {row.id: row for row in db.execute(select(Turn).where(Turn.id.in_(ids))).scalars()}

    return read_db(query)


def wait_finished(turn_ids: Iterable[uuid.UUID], *, timeout: float) -> dict[uuid.UUID, Turn]:
    """Poll until every turn is finished (tolerating Postgres outages); return the rows."""
    ids = list(turn_ids)
    deadline = time.monotonic() + timeout
    while True:
        rows = load_turns(ids)
        if len(rows) == len(ids) and all(row.status.value in FINISHED for row in rows.values()):
            return rows
        if time.monotonic() > deadline:
            pending = {str(k)[:8]: v.status.value for k, v in rows.items() if v.status.value not in FINISHED}
            raise AssertionError(f"{len(pending)} of {len(ids)} turns not finished after {timeout:.0f}s: {pending}")
        time.sleep(0.2)


def wait_status(turn_id: uuid.UUID, status: str, *, timeout: float) -> Turn:
    """Poll until the turn has `status`."""
    deadline = time.monotonic() + timeout
    while True:
        row = load_turns([turn_id]).get(turn_id)
        if row is not None and row.status.value == status:
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"turn {turn_id} is {row.status.value if row else 'missing'}, not {status}")
        time.sleep(0.05)


def messages_by_turn(session_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, list[ChatMessage]]:
    """Every stored message of these sessions, grouped by turn, in position order."""
    ids = list(session_ids)

    def query() -> dict[uuid.UUID, list[ChatMessage]]:
        grouped: dict[uuid.UUID, list[ChatMessage]] = {}
        with session_scope() as db:
            rows = db.execute(
                select(ChatMessage)
                .where(ChatMessage.session_id.in_(ids))
                .order_by(ChatMessage.session_id, ChatMessage.position)
            ).scalars()
            for message in rows:
                if message.turn_id is not None:
                    grouped.setdefault(message.turn_id, []).append(message)
        return grouped

    return read_db(query)


def session_transcript(session_id: uuid.UUID) -> list[tuple[str, str]]:
    """(role, content) of every stored message of a session, in order."""

    def query() -> list[tuple[str, str]]:
        with session_scope() as db:
            rows = db.execute(
                select(ChatMessage.role, ChatMessage.content)
                .where(ChatMessage.session_id == session_id)
                .order_by(ChatMessage.position)
            ).all()
        return [(row.role, row.content) for row in rows]

    return read_db(query)


def assert_each_turn_answered_once(rows: Mapping[uuid.UUID, Turn], texts: Mapping[uuid.UUID, list[str]]) -> None:
    """Every turn in `rows` succeeded and holds its user message and exactly one reply, and each
    session's transcript is its user messages (`texts`, in submission order), each followed by its reply."""
    assert {str(k)[:8]: (r.status.value, r.error) for k, r in rows.items() if r.status.value != "succeeded"} == {}
    by_turn = messages_by_turn(texts)
    assert {t: [m.role for m in by_turn.get(t, [])] for t in rows} == {t: ["user", "assistant"] for t in rows}
    for session_id, expected in texts.items():
        transcript = session_transcript(session_id)
        assert [content for role, content in transcript if role == "user"] == expected
        assert [role for role, _ in transcript] == ["user", "assistant"] * len(expected)


def event_types(redis_url: str, turn_id: uuid.UUID) -> list[str]:
    """The `type` of every event in the turn's replay stream."""
    return [event["type"] for event in replay_events(redis_url, turn_id)]


def wait_for_event(
    redis_url: str, turn_id: uuid.UUID, type_: str, *, count: int = 1, timeout: float = 30.0
) -> dict[str, Any]:
    """Wait until the turn's replay stream holds `count` events of `type_`; return the last of them."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):
            matching = [e for e in replay_events(redis_url, turn_id) if e["type"] == type_]
            if len(matching) >= count:
                return matching[count - 1]
        if time.monotonic() > deadline:
            raise AssertionError(f"turn {turn_id}: no {count} {type_!r} event(s) after {timeout:.0f}s")
        time.sleep(0.05)


# --- Postgres restarts ---------------------------------------------------------------------------


def _run(command: list[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    # From "/": as root the server's commands run as `postgres`, which may not enter the checkout
    # (a clone in a 0700 folder).
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, cwd="/")


def _local(host: str | None) -> bool:
    return host in (None, "", "localhost", "127.0.0.1", "::1")


@dataclass(kw_only=True)
class PostgresControl:
    """How to restart the Postgres that the test database lives on."""

    host: str
    port: int
    description: str
    restart_command: list[str]
    stop_command: list[str]
    start_command: list[str]

    def ready(self) -> bool:
        """pg_isready says the server accepts connections."""
        result = _run(["pg_isready", "-q", "-h", self.host, "-p", str(self.port), "-t", "2"], timeout=10)
        return result.returncode == 0

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until the server accepts connections."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return True
            time.sleep(0.2)
        return False

    def restart(self) -> float:
        """Restart the server (fast shutdown: sessions are cut); returns how long it took."""
        started = time.monotonic()
        result = _run(self.restart_command)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(self.restart_command)} failed: {result.stderr.strip() or result.stdout}")
        if not self.wait_ready():
            raise RuntimeError(f"Postgres ({self.description}) did not come back after a restart")
        return time.monotonic() - started

    def ensure_running(self) -> None:
        """Start the server if it does not answer (teardown)."""
        if self.ready():
            return
        _run(self.start_command)
        if not self.wait_ready():
            raise RuntimeError(f"Postgres ({self.description}) is down and could not be started again")


def postgres_control(database_url: str) -> PostgresControl | str:
    """How to restart the server of `database_url`, or why it cannot be done here."""
    url = make_url(database_url)
    host, port = url.host or "localhost", url.port or 5432
    if not _local(host):
        return f"Postgres at {host}:{port} is not on this machine"
    if shutil.which("pg_isready") is None:
        return "pg_isready is not installed"
    if shutil.which("pg_ctlcluster") and Path("/etc/postgresql").is_dir():
        for line in _run(["pg_lsclusters", "--no-header"]).stdout.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == str(port) and parts[3] == "online":
                version, cluster = parts[0], parts[1]
                base = ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster]
                return PostgresControl(
                    host="127.0.0.1",
                    port=port,
                    description=f"cluster {version}/{cluster}",
                    restart_command=[*base, "restart"],
                    stop_command=[*base, "stop"],
                    start_command=[*base, "start"],
                )
    # scripts/services.sh may keep the cluster outside the checkout (root, a 0700 folder) and link
    # .local/pg to it: `postgres` must be given the real paths, which it can reach.
    data = (ROOT / ".local" / "pg").resolve()
    if (data / "PG_VERSION").is_file():
        pg_ctl = shutil.which("pg_ctl") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
        if pg_ctl is None:
            return "a private Postgres lives in .local/pg but pg_ctl is not installed"
        run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        base = [*run_as, str(pg_ctl), "-D", str(data), "-w"]
        # The server pg_ctl starts must log to a file, never to this test's pipes: it outlives the
        # test, and a server writing into a closed pipe (or a pipe nobody reads) hangs.
        log_file = ["-l", str((ROOT / ".local" / "pg.log").resolve())]
        return PostgresControl(
            host="127.0.0.1",
            port=port,
            description=f"private instance in {data}",
            restart_command=[*base, "-m", "fast", *log_file, "restart"],
            stop_command=[*base, "-m", "fast", "stop"],
            start_command=[*base, *log_file, "-o", f"-p {port} -k /tmp -c listen_addresses=127.0.0.1", "start"],
        )
    return f"do not know how to restart the Postgres at {host}:{port} (no pg_ctlcluster cluster, no .local/pg)"


# --- Redis restarts ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class RedisControl:
    """How to restart the Redis that the test's Redis db lives on (it keeps nothing on disk)."""

    host: str
    port: int
    own_db: int
    start_commands: list[list[str]]
    """Tried in order until one starts a server that answers."""
    saved: dict[int, list[tuple[bytes, bytes, int]]] = field(default_factory=dict)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, db=db, socket_connect_timeout=1, socket_timeout=5)

    def ready(self) -> bool:
        """The server answers PING."""
        client = self.client()
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _port_open(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((self.host, self.port)) == 0

    def _snapshot_others(self) -> None:
        """Keep every key of the other logical dbs (other test runs, their db locks), to put back after.

        The restart is meant to wipe this test's db only; other runs sharing the server lose at
        most what they wrote during the restart window.
        """
        self.saved = {}
        client = self.client()
        try:
            keyspace: dict[str, Any] = client.info("keyspace")
        finally:
            client.close()
        for name in keyspace:
            db = int(str(name).removeprefix("db"))
            if db == self.own_db:
                continue
            source = self.client(db)
            try:
                entries: list[tuple[bytes, bytes, int]] = []
                for key in source.scan_iter(count=500):
                    pipe = source.pipeline(transaction=False)
                    pipe.dump(key)
                    pipe.pttl(key)
                    dumped, pttl = pipe.execute()
                    if dumped is not None and pttl != -2:
                        entries.append((key, dumped, max(int(pttl), 0)))
                    if len(entries) > 20_000:
                        break
                self.saved[db] = entries
            finally:
                source.close()

    def _restore_others(self) -> None:
        for db, entries in self.saved.items():
            target = self.client(db)
            try:
                for key, dumped, ttl in entries:
                    with contextlib.suppress(redis.ResponseError):  # BUSYKEY: written again meanwhile
                        target.restore(key, ttl, dumped)
            finally:
                target.close()
        self.saved = {}

    def _start(self) -> None:
        for command in self.start_commands:
            _run(command, timeout=30)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.ready():
                    return
                time.sleep(0.05)
        raise RuntimeError(f"Redis on port {self.port} could not be started: tried {self.start_commands}")

    def restart(self, *, down_for: float = 1.0) -> float:
        """SHUTDOWN NOSAVE, stay down `down_for` seconds (a real restart is not instant), start again
        with the documented command; returns the outage in seconds."""
        self._snapshot_others()
        started = time.monotonic()
        _run(["redis-cli", "-h", self.host, "-p", str(self.port), "shutdown", "nosave"], timeout=30)
        deadline = time.monotonic() + 10
        while self._port_open() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(down_for)
        self._start()
        outage = time.monotonic() - started
        self._restore_others()
        return outage

    def ensure_running(self) -> None:
        """Start Redis if it does not answer (teardown), and put back what other runs had."""
        if not self.ready():
            self._start()
        if self.saved:
            self._restore_others()


def redis_control(redis_url: str) -> RedisControl | str:
    """How to restart the Redis of `redis_url`, or why it cannot be done here."""
    parts = urlsplit(redis_url)
    if parts.scheme != "redis":
        return f"only plain redis:// URLs are restarted, not {parts.scheme}://"
    host, port = parts.hostname or "localhost", parts.port or 6379
    if parts.password:
        return "a Redis with a password is not one this test started"
    if not _local(host):
        return f"Redis at {host}:{port} is not on this machine"
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        return "redis-server/redis-cli are not installed"
    own_db = int(parts.path.strip("/") or 0)
    common = ["--daemonize", "yes", "--port", str(port), "--save", "", "--appendonly", "no"]
    if port == 6379:
        files = ["--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]
    elif (ROOT / ".local").is_dir():
        # The pid file scripts/services.sh stops this clone's private Redis by.
        files = [
            "--dir",
            str(ROOT / ".local"),
            "--logfile",
            str(ROOT / ".local" / "redis.log"),
            "--pidfile",
            str(ROOT / ".local" / "redis.pid"),
        ]
    else:
        return f"do not know how Redis on port {port} was started"
    return RedisControl(
        host="127.0.0.1",
        port=port,
        own_db=own_db,
        start_commands=[
            ["redis-server", *common[:2], "--bind", "127.0.0.1", "-::1", *common[2:], *files],
            ["redis-server", *common[:2], "--bind", "127.0.0.1", *common[2:], *files],
        ],
    )

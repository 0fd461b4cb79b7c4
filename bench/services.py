"""Private Redis and Postgres servers for a benchmark run.

On a shared machine other people's fault tests restart the Redis and Postgres on the default ports,
and their load lands in the same servers: a benchmark there measures its neighbours. With
`--services private` (the default when `redis-server` and `initdb`/`pg_ctl` are installed) the run
starts its own servers with stock settings on free ports, points DATABASE_URL/REDIS_URL at them for
every benchmark, and removes them at the end. `--services shared` uses DATABASE_URL/REDIS_URL as
given (what `make bench` sets up). Either way each benchmark still gets a fresh database and a
private Redis db (tests/support/services.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


def private_available() -> bool:
    return bool(shutil.which("redis-server") and _pg_bin("initdb") and _pg_bin("pg_ctl"))


def _versions(database_url: str, redis_url: str) -> dict[str, str]:
    import psycopg
    import redis
    from sqlalchemy.engine import make_url

    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        client = redis.Redis.from_url(redis_url)
        out["redis"] = str(client.info("server").get("redis_version"))
        client.close()
    with contextlib.suppress(Exception):
        u = make_url(database_url)
        with psycopg.connect(
            host=u.host or "localhost", port=u.port or 5432, user=u.username or "postgres", dbname="postgres"
        ) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            out["postgres"] = str(row[0]) if row else "?"
            row = conn.execute("SHOW max_connections").fetchone()
            out["postgres max_connections"] = str(row[0]) if row else "?"
    return out


@contextlib.contextmanager
def private_services() -> Iterator[dict[str, str]]:
    """Start redis-server and a Postgres cluster on free ports; yield their URLs; stop and delete them."""
    base = Path(tempfile.mkdtemp(prefix="chatq-bench-services-"))
    redis_port, pg_port = _free_port(), _free_port()
    redis_proc: subprocess.Popen[bytes] | None = None
    pg_ctl = _pg_bin("pg_ctl")
    initdb = _pg_bin("initdb")
    assert pg_ctl and initdb
    data = base / "pg"
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
    started_pg = False
    try:
        redis_proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        subprocess.run(
            [*run_as, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                *run_as,
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(base / "pg.log"),
                "-o",
                f"-p {pg_port} -k {base} -c listen_addresses=127.0.0.1"
                # Statement counts per turn for the reports (`pg_statements` in bench/common.py).
                " -c shared_preload_libraries=pg_stat_statements",
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        started_pg = True
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        database_url = f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/chatq"
        deadline = time.monotonic() + 10
        import redis

        while True:
            try:
                redis.Redis.from_url(redis_url).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    finally:
        if started_pg:
            subprocess.run(
                [*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        if redis_proc is not None:
            redis_proc.terminate()
            try:
                redis_proc.wait(10)
            except subprocess.TimeoutExpired:
                redis_proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def describe(database_url: str, redis_url: str, mode: str) -> dict[str, str]:
    """What the run measures against, for the report header."""
    return {"services": mode, **_versions(database_url, redis_url)}

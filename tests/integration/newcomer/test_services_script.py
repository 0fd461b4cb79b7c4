"""scripts/services.sh on a fresh machine: a clone in a private folder, and a second terminal.

It runs the real script in a scratch copy of the clone inside a folder of mode 0700 (as `mktemp -d`
makes, and as /root is), with DATABASE_URL and REDIS_URL on free ports, so it starts private
instances of Postgres and Redis there; as root that is where `initdb` (run as `postgres`) used to
fail with "Permission denied". Then the terminals that follow: without exports the clone keeps what
it recorded (starting it again when it is down), and an explicit export switches it, loudly. The
private instances are stopped and their data removed at the end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from chatq.envfile import read_env_files
from tests.support.workers import ROOT

pytestmark = pytest.mark.slow

INITDB = shutil.which("initdb") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Path]:
    """The script in a clone under a 0700 folder; its private instances stopped and removed afterwards."""
    if INITDB is None or shutil.which("redis-server") is None:
        pytest.skip("needs initdb and redis-server installed (apt-get install postgresql redis-server)")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    root = private / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "services.sh", root / "scripts" / "services.sh")
    try:
        yield root
    finally:
        _services(root, {}, "remove")


def _services(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """scripts/services.sh in `root`, with exactly `env` for the URLs (none exported unless given)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        ["bash", str(root / "scripts" / "services.sh"), *args],
        env={**base, "PY": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _answers(database_url: str, redis_url: str) -> None:
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"), connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("chatq",)
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
    try:
        assert client.ping()
    finally:
        client.close()


def test_a_clone_in_a_private_folder_keeps_its_services(clone: Path, chatq_env: dict[str, str]) -> None:
    database_url = f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/chatq"
    redis_url = f"redis://127.0.0.1:{_free_port()}/0"
    recorded = clone / ".local" / "services.env"

    # The first terminal: private instances on the exported ports, from inside a 0700 folder.
    first = _services(clone, {"DATABASE_URL": database_url, "REDIS_URL": redis_url})
    assert first.returncode == 0, first.stderr
    assert "starting a private Postgres" in first.stderr and "starting a private Redis" in first.stderr
    assert "Permission denied" not in first.stderr
    assert read_env_files(clone, (Path(".local/services.env"),)) == {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
    }
    _answers(database_url, redis_url)

    # A second terminal without the exports keeps them (it used to rewrite localhost:5432/6379).
    second = _services(clone, {})
    assert second.returncode == 0, second.stderr
    assert "uses the services recorded in .local/services.env" in second.stderr
    assert read_env_files(clone, (Path(".local/services.env"),))["DATABASE_URL"] == database_url
    assert "SWITCHED" not in second.stderr

    # Down (a reboot, `services.sh stop`): the next terminal without exports starts the same ones again.
    assert _services(clone, {}, "stop").returncode == 0
    again = _services(clone, {})
    assert again.returncode == 0, again.stderr
    assert "starting a private Postgres" in again.stderr and "starting a private Redis" in again.stderr
    _answers(database_url, redis_url)

    # Only an explicit export switches the clone, and it says so loudly.
    switched = _services(clone, {"REDIS_URL": chatq_env["REDIS_URL"]})
    assert switched.returncode == 0, switched.stderr
    assert "SWITCHED this clone's REDIS_URL" in switched.stderr
    assert read_env_files(clone, (Path(".local/services.env"),)) == {
        "DATABASE_URL": database_url,
        "REDIS_URL": chatq_env["REDIS_URL"],
    }
    # What the Makefile sources reads the same.
    sourced = subprocess.run(
        ["bash", "-c", f"set -a; . '{recorded}'; printf '%s %s' \"$DATABASE_URL\" \"$REDIS_URL\""],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert sourced.stdout == f"{database_url} {chatq_env['REDIS_URL']}"

"""A terminal in the checkout reaches the services `make run` uses: every entry point reads `.env`-style files.

Real subprocesses (`chatq`, the Python API, `celery -A worker`) in a scratch directory, with
DATABASE_URL/REDIS_URL taken out of their environment, so that only the files (or an explicit
variable) can point them at the test database.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.factories import add_turn, assistant, create_session, user

# Each test runs chatq subprocesses.
pytestmark = pytest.mark.slow


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _chatq_in(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`chatq ARGS` run from `directory` with exactly `env` (plus PATH and the like, never the URLs)."""
    return _python_in(directory, env, "-m", "worker.cli", *args)


def _python_in(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` run from `directory` with exactly `env` (plus PATH and the like, never the URLs)."""
    # The suite sets CHATQ_ENV_FILES="" (tests/conftest.py): without it, the default files apply.
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CHATQ_ENV_FILES")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=directory,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_services_env_dotenv_and_the_environment_in_that_order(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    # Read-only commands only: if the files were not read, `chatq` would fall back to the default
    # URLs (the machine's own services), and a test must not write there.
    turn = add_turn(create_session(), [user("hi"), assistant("hello")])
    # What scripts/services.sh writes for `make run`: the only place the test database is named.
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "services.env").write_text(
        f"DATABASE_URL={chatq_env['DATABASE_URL']}\nREDIS_URL={chatq_env['REDIS_URL']}\n"
    )
    shown = _chatq_in(tmp_path, {}, "show", str(turn.id), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == str(turn.id)

    # .env comes first: here it names a port where nothing listens, and the error says so.
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{_unused_port()}/chatq"
    (tmp_path / ".env").write_text(f"# mine\nexport DATABASE_URL='{nowhere}'\n")
    refused = _chatq_in(tmp_path, {}, "show", str(turn.id))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"chatq: error: cannot use Postgres at {nowhere}: ")
    assert refused.stderr.count("\n") == 1

    # The environment wins over both files.
    exported = _chatq_in(tmp_path, {"DATABASE_URL": chatq_env["DATABASE_URL"]}, "show", str(turn.id), "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["id"] == str(turn.id)


def test_a_malformed_dotenv_is_one_clear_line(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    (tmp_path / ".env").write_text("CHATQ_MODEL=echo\nthis is not a setting\n")
    result = _chatq_in(tmp_path, chatq_env, "session", "create")
    assert result.returncode == 1
    assert result.stderr == "chatq: error: .env line 2: expected NAME=value\n"
    assert result.stdout == ""


def test_worker_reads_the_files_too(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    """`chatq worker` (which execs Celery) gets the variables: a bad value from .env stops it in one line."""
    (tmp_path / ".env").write_text("CHATQ_WORKER_CONCURRENCY=lots\n")
    result = _chatq_in(tmp_path, chatq_env, "worker")
    assert result.returncode == 1
    assert result.stderr == "chatq: error: CHATQ_WORKER_CONCURRENCY must be a whole number, got 'lots'\n"


def test_chatq_env_files_chooses_the_files(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    """CHATQ_ENV_FILES replaces the list: here only a file of the user's choosing is read."""
    (tmp_path / ".env").write_text("CHATQ_WORKER_CONCURRENCY=lots\n")
    (tmp_path / "staging.env").write_text("CHATQ_WORKER_CONCURRENCY=many\n")
    chosen = _chatq_in(tmp_path, {**chatq_env, "CHATQ_ENV_FILES": "staging.env"}, "worker")
    assert chosen.stderr == "chatq: error: CHATQ_WORKER_CONCURRENCY must be a whole number, got 'many'\n"
    none = _chatq_in(tmp_path, {**chatq_env, "CHATQ_ENV_FILES": "", "CHATQ_WORKER_CONCURRENCY": "x"}, "worker")
    assert none.stderr == "chatq: error: CHATQ_WORKER_CONCURRENCY must be a whole number, got 'x'\n"


def _record_services(directory: Path, database_url: str, redis_url: str) -> None:
    """What scripts/services.sh writes for `make run` (single-quoted, as it writes them)."""
    (directory / ".local").mkdir(exist_ok=True)
    (directory / ".local" / "services.env").write_text(f"DATABASE_URL='{database_url}'\nREDIS_URL='{redis_url}'\n")


API_SHOW = "import sys; from worker.producer import get_session; print(get_session(sys.argv[1])['id'])"
"""The README's Python API in a second terminal: read a session (read-only, see above)."""


def test_the_python_api_reads_the_same_files(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    session_id = create_session()
    _record_services(tmp_path, chatq_env["DATABASE_URL"], chatq_env["REDIS_URL"])
    shown = _python_in(tmp_path, {}, "-c", API_SHOW, str(session_id))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str(session_id)

    # An exported DATABASE_URL wins over the file: here one where nothing listens.
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{_unused_port()}/chatq"
    exported = _python_in(tmp_path, {"DATABASE_URL": nowhere}, "-c", API_SHOW, str(session_id))
    assert exported.returncode != 0
    assert "Connection refused" in exported.stderr or "connection failed" in exported.stderr


def test_celery_a_worker_reads_the_same_files(tmp_path: Path, chatq_env: dict[str, str]) -> None:
    """`celery -A worker ...` builds its broker URL from the settings, which apply the files first."""
    _record_services(tmp_path, chatq_env["DATABASE_URL"], chatq_env["REDIS_URL"])
    host_and_db = chatq_env["REDIS_URL"].split("@")[-1].split("://")[-1]  # e.g. localhost:6379/13
    report = _python_in(tmp_path, {}, "-m", "celery", "-A", "worker", "report")
    assert report.returncode == 0, report.stderr
    assert "broker_url: 'redis://" in report.stdout
    assert host_and_db in report.stdout.split("broker_url: ", 1)[1].splitlines()[0]

    other = "redis://127.0.0.1:6379/14"
    exported = _python_in(tmp_path, {"REDIS_URL": other}, "-m", "celery", "-A", "worker", "report")
    assert "127.0.0.1:6379/14" in exported.stdout.split("broker_url: ", 1)[1].splitlines()[0]

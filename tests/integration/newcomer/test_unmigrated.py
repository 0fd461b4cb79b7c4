"""A database nobody ran `chatq db upgrade` on: the CLI, `chatq worker`, `chatq serve` and the Python API
say so in one line."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator

import pytest

from tests.support.cli import chatq
from tests.support.env import environ
from tests.support.services import fresh_database

# Each test runs chatq subprocesses.
pytestmark = pytest.mark.slow


@pytest.fixture
def unmigrated(chatq_env: dict[str, str]) -> Iterator[dict[str, str]]:
    with fresh_database("chatq_unmigrated", migrate=False) as url:
        yield {**chatq_env, "DATABASE_URL": url}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


HINT = re.compile(r"^chatq: error: the database at \S+ has no chatq tables yet: run `chatq db upgrade`\n$")


@pytest.mark.parametrize(
    "command",
    [
        ("session", "create"),
        ("usage",),
        ("worker",),
        ("serve", "--unauthenticated", "--port", "0"),
    ],
    ids=["session-create", "usage", "worker", "serve"],
)
def test_says_to_run_db_upgrade(unmigrated: dict[str, str], command: tuple[str, ...]) -> None:
    if command[0] == "serve":
        command = (*command[:-1], str(_free_port()))
    result = chatq(unmigrated, *command, timeout=60)
    assert result.returncode == 1
    assert HINT.match(result.stderr), result.stderr
    assert "chatq_unmigrated" in result.stderr  # which database, so the user upgrades the right one


def test_after_db_upgrade_the_same_command_works(unmigrated: dict[str, str]) -> None:
    assert chatq(unmigrated, "db", "upgrade").returncode == 0
    created = chatq(unmigrated, "session", "create", "--framework", "none")
    assert created.returncode == 0, created.stderr


def test_worker_help_needs_no_database(unmigrated: dict[str, str]) -> None:
    result = chatq(unmigrated, "worker", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--concurrency" in result.stdout


def test_the_python_api_raises_the_same_one_line_error(unmigrated: dict[str, str]) -> None:
    """The README's Python API on that database: SchemaMissing with the CLI's line, not SQLAlchemy's traceback."""
    from models.db import dispose_engine
    from worker.errors import SchemaMissing
    from worker.producer import create_session, list_sessions, submit_turn

    dispose_engine()
    try:
        with environ(DATABASE_URL=unmigrated["DATABASE_URL"]):
            dispose_engine()
            for call in (create_session, list_sessions, lambda: submit_turn(uuid.uuid4(), "hello")):
                with pytest.raises(SchemaMissing) as raised:
                    call()
                line = f"chatq: error: {raised.value.message}\n"
                assert HINT.match(line), line
                assert "chatq_unmigrated" in line
                assert raised.value.__cause__ is None and raised.value.__suppress_context__
    finally:
        dispose_engine()

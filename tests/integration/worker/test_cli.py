"""The `chatq` command line as a user runs it: real subprocesses against the real worker, and what
fails before any turn is queued in this process (`tests.support.cli.chatq_here`: the CLI's `main`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from models.db import session_scope
from models.tables import Turn
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.broker import wait_for_subscriber
from tests.support.cli import chatq, chatq_here
from tests.support.turns import replay_events, wait_for_turn
from tests.support.workers import ROOT, WorkerProcess
from worker.events import session_channel


def _new_session(env: dict[str, str], *extra: str) -> str:
    result = chatq_here(env, "session", "create", "--model", STUB_MODEL, *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_submit_follow_streams_the_reply_and_exits_0(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    session = _new_session(worker_env)
    uuid.UUID(session)
    result = chatq(worker_env, "submit", session, "hello chatq", "--follow")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "You said: hello chatq"
    assert "[done:" in result.stderr


@pytest.mark.slow
def test_submit_follow_exits_1_when_the_turn_fails(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    session = _new_session(worker_env)
    result = chatq(worker_env, "submit", session, "doomed [fail]", "--follow")
    assert result.returncode == 1
    assert "[failed:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_submit_prints_the_turn_id_and_show_json_reports_it(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    session = _new_session(worker_env, "--system-prompt", "Be brief.")
    turn_id = str(uuid.uuid4())
    result = chatq(worker_env, "submit", session, "six times seven [calc: 6*7]", "--turn-id", turn_id)
    assert result.returncode == 0 and result.stdout.strip() == turn_id
    wait_for_turn(uuid.UUID(turn_id))
    shown = chatq(worker_env, "show", turn_id, "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["id"] == turn_id and report["session_id"] == session
    assert report["status"] == "succeeded" and report["attempts"] == 1 and report["error"] is None
    assert set(report["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert [m["role"] for m in report["messages"]] == ["user", "assistant", "tool", "assistant"]
    human = chatq(worker_env, "show", turn_id)
    assert "succeeded" in human.stdout and "calculator" in human.stdout
    # The same turn id again is accepted once: idempotent, no second turn.
    again = chatq(worker_env, "submit", session, "six times seven [calc: 6*7]", "--turn-id", turn_id, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["created"] is False


@pytest.mark.slow
def test_a_late_watch_turn_replays_every_event(
    worker: WorkerProcess, worker_env: dict[str, str], redis_url: str
) -> None:
    session = _new_session(worker_env)
    turn_id = chatq(worker_env, "submit", session, "replay me [words: 8]").stdout.strip()
    wait_for_turn(uuid.UUID(turn_id))
    stored = replay_events(redis_url, uuid.UUID(turn_id))
    result = chatq(worker_env, "watch", "--turn", turn_id, "--json")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert printed == stored
    assert printed[0]["type"] == "queued" and printed[-1]["type"] == "final"


@pytest.mark.slow
def test_watch_session_prints_live_events(worker: WorkerProcess, worker_env: dict[str, str], redis_url: str) -> None:
    session = _new_session(worker_env)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "watch", session, "--json"],
        cwd=ROOT,
        env={**os.environ, **worker_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_subscriber(redis_url, session_channel(session))
        turn_id = chatq(worker_env, "submit", session, "live [words: 3]").stdout.strip()
        wait_for_turn(uuid.UUID(turn_id))
        lines: list[str] = []
        assert watcher.stdout is not None
        while not lines or json.loads(lines[-1])["type"] != "final":
            lines.append(watcher.stdout.readline())  # the pytest timeout bounds a watcher that stops early
    finally:
        watcher.terminate()
        watcher.communicate(timeout=10)
    types = [json.loads(line)["type"] for line in lines]
    assert types[0] == "queued" and types[-1] == "final" and "text" in types


@pytest.mark.slow
def test_usage_totals_match_the_turns(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    session = _new_session(worker_env)
    for text in ("one", "two"):
        assert chatq(worker_env, "submit", session, text, "--follow").returncode == 0
    report = json.loads(chatq(worker_env, "usage", "--session", session, "--json").stdout)
    assert report["turns"] == 2
    assert report["total_tokens"] == report["prompt_tokens"] + report["completion_tokens"] > 0
    assert report["by_model"][0]["model"] == STUB_MODEL


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("show", "not-a-uuid"), "turn_id is not a valid UUID"),
        (("show", "00000000-0000-0000-0000-000000000001"), "does not exist"),
        (("submit", "00000000-0000-0000-0000-000000000001", "hi"), "does not exist"),
        (("session", "create", "--framework", "crewai"), "unknown agent framework 'crewai'"),
        (("cancel", "00000000-0000-0000-0000-000000000001"), "does not exist"),
        (("usage", "--session", "nope"), "session is not a valid UUID"),
    ],
)
def test_errors_are_one_line_without_a_traceback(
    worker_env: dict[str, str], args: tuple[str, ...], fragment: str
) -> None:
    result = chatq_here(worker_env, *args)
    assert result.returncode == 1
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_oversize_and_bad_images_fail_before_anything_is_stored(worker_env: dict[str, str], tmp_path: Path) -> None:
    session = _new_session(worker_env)
    result = chatq_here({**worker_env, "CHATQ_MAX_CONTENT_CHARS": "10"}, "submit", session, "x" * 11)
    assert result.returncode == 1 and "over the limit of 10" in result.stderr
    result = chatq_here(worker_env, "submit", session, "look", "--image", str(tmp_path / "missing.png"))
    assert result.returncode == 1 and "image file not found" in result.stderr
    report = json.loads(chatq_here(worker_env, "usage", "--session", session, "--json").stdout)
    assert report["turns"] == 0


@pytest.mark.slow
def test_an_unreachable_database_is_one_clear_line(worker_env: dict[str, str]) -> None:
    env = {**worker_env, "DATABASE_URL": "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/nowhere"}
    result = chatq(env, "show", str(uuid.uuid4()))
    assert result.returncode == 1
    assert "cannot use Postgres" in result.stderr and "hunter2" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_producer_commands_import_no_agent_framework(worker_env: dict[str, str]) -> None:
    code = (
        "import sys, worker.cli.commands, worker.producer, worker.queries, worker.cli.follow;"
        "import worker.dispatch, worker.app;"
        "frameworks = ('langchain_core', 'langgraph', 'langchain_openai', 'openai');"
        "bad = [m for m in sys.modules if m.split('.')[0] in frameworks];"
        "print(bad)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_text_and_numbers_postgres_cannot_store_are_one_clear_line_naming_the_field(
    worker_env: dict[str, str],
) -> None:
    session = _new_session(worker_env)
    # A terminal that is not UTF-8 hands Python bytes it keeps as lone surrogates (b"caf\xe9").
    latin1 = chatq_here(worker_env, "submit", session, "caf\udce9")
    assert latin1.returncode == 1
    assert latin1.stderr.strip() == (
        "chatq: error: content contains a lone surrogate (U+DCE9) at position 3, which cannot be stored; "
        "send valid Unicode text without NUL"
    )
    too_big = chatq_here(worker_env, "submit", session, "hello", "--reply-to", str(2**63))
    assert too_big.returncode == 1
    assert too_big.stderr.strip() == (
        "chatq: error: reply_to must be a message id from 1 to 9223372036854775807, or null"
    )
    model = chatq_here(worker_env, "session", "create", "--model", "gpt\udcff")
    assert model.returncode == 1 and "model contains a lone surrogate (U+DCFF)" in model.stderr
    prompt = chatq_here(worker_env, "session", "create", "--system-prompt", "be \udce9")
    assert prompt.returncode == 1 and "system_prompt contains a lone surrogate" in prompt.stderr
    for result in (latin1, too_big, model, prompt):
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with session_scope() as db:
        assert db.query(Turn).filter(Turn.session_id == uuid.UUID(session)).count() == 0

"""`chatq session list|show|delete` and `chatq history` as a user runs them: `history` as real
subprocesses beside a real worker, the others' `main` in this process (`tests.support.cli.chatq_here`)."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.integration.sessions.conftest import STUB_MODEL
from tests.support.cli import chatq, chatq_here
from tests.support.scan import tables_mentioning
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn, wait_for_turn


def test_session_list_pages_newest_first_and_show_prints_the_session(worker_env: dict[str, str]) -> None:
    label = uuid.uuid4().hex
    ids = [str(create_session(framework="none", metadata={"label": label}, system_prompt="Be kind.")) for _ in range(3)]
    first = chatq_here(worker_env, "session", "list", "--limit", "2", "--metadata", f"label={label}", "--json")
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert [s["id"] for s in page["sessions"]] == [ids[2], ids[1]]
    rest = chatq_here(worker_env, "session", "list", "--metadata", f"label={label}", "--cursor", page["next_cursor"])
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.split()[0] == ids[0] and len(rest.stdout.splitlines()) == 1
    text = chatq_here(worker_env, "session", "list", "--limit", "1", "--metadata", f"label={label}")
    assert text.stdout.startswith(ids[2]) and "more: chatq session list --limit 1 --cursor " in text.stderr

    shown = chatq_here(worker_env, "session", "show", ids[0])
    assert shown.returncode == 0, shown.stderr
    assert f"session        {ids[0]}" in shown.stdout and "system prompt  Be kind." in shown.stdout
    as_json = json.loads(chatq_here(worker_env, "session", "show", ids[0], "--json").stdout)
    assert as_json["id"] == ids[0] and as_json["metadata"] == {"label": label}


@pytest.mark.slow
def test_history_prints_the_turns_a_page_at_a_time(worker: WorkerProcess, worker_env: dict[str, str]) -> None:
    sid = create_session(framework="langgraph", model=STUB_MODEL)
    turns = [submit_turn(sid, f"question {n}").turn_id for n in range(3)]
    for turn_id in turns:
        assert wait_for_turn(turn_id, timeout=60)["status"] == "succeeded"
    newest = chatq(worker_env, "history", str(sid), "--limit", "2")
    assert newest.returncode == 0, newest.stderr
    lines = newest.stdout.splitlines()
    assert lines[0] == f"--- turn {turns[1]}  position 1  succeeded"
    assert lines[1:3] == ["[user] question 1", "[assistant] You said: question 1"]
    assert f"--- turn {turns[2]}  position 2  succeeded" in lines
    cursor = newest.stderr.split("--before ")[1].strip()
    older = json.loads(chatq(worker_env, "history", str(sid), "--before", cursor, "--json").stdout)
    assert [t["id"] for t in older["turns"]] == [str(turns[0])] and older["next_cursor"] is None
    assert [m["role"] for m in older["turns"][0]["messages"]] == ["user", "assistant"]


def test_session_delete_removes_it_and_errors_are_one_line(worker_env: dict[str, str]) -> None:
    sid = create_session(framework="none", model=STUB_MODEL)
    submit_turn(sid, "long [words: 400] [slow: 0.05]")  # queued or running when deleted: stopped either way
    result = chatq_here(worker_env, "session", "delete", str(sid))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"session {sid} deleted with 1 turn(s), 1 of them stopped first"
    assert tables_mentioning([str(sid)]) == {}
    for args in (("session", "show", str(sid)), ("session", "delete", str(sid)), ("history", str(sid))):
        again = chatq_here(worker_env, *args)
        assert again.returncode == 1
        assert again.stderr == f"chatq: error: session {sid} does not exist\n"
    bad = chatq_here(worker_env, "history", str(sid), "--before", "garbage")
    assert bad.returncode == 1 and bad.stderr.startswith("chatq: error: cursor 'garbage' is not a cursor")
    bad_limit = chatq_here(worker_env, "session", "list", "--limit", "0")
    assert bad_limit.returncode == 1 and "limit must be a whole number from 1 to 1000" in bad_limit.stderr

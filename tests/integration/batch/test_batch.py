"""`chatq batch` end to end: real CLI subprocesses, two real workers, the model stub."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn
from tests.integration.batch.conftest import HoldingStub
from tests.support.cli import chatq
from tests.support.turns import session_messages, wait_for_turn
from tests.support.workers import ROOT, WorkerProcess
from worker.cli.batch import session_uuid, turn_uuid
from worker.cli.batch_cli import default_batch_id
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow
STUB_MODEL = "gpt-4o-mini"


def write_batch(
    path: Path, conversations: int, turns: int, *, extra: str = "", staggered: bool = False
) -> list[dict[str, object]]:
    lines = [
        {
            "id": f"conv-{c}",
            "session": {"framework": "langgraph" if c % 2 else "none", "model": STUB_MODEL},
            "turns": [
                f"c{c} t{t} {extra}{f' [words: {2 + 3 * c}]' if staggered else ''}".strip() for t in range(turns)
            ],
        }
        for c in range(conversations)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def result_ids(out: Path) -> list[str]:
    """The conversation ids in a results file (none if it does not exist yet)."""
    if not out.exists():
        return []
    return [json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()]


def record_users(record: dict[str, Any]) -> list[str]:
    return [turn["user"] for turn in record["turns"]]


def assert_pairs_each_text_with_its_reply(out: Path) -> None:
    """Every turn of every result line succeeded with the stub's echo of its own user text."""
    for record in map(json.loads, out.read_text().splitlines()):
        for turn in record["turns"]:
            text = " ".join(re.sub(r"\[[a-z-]+:[^\]]*\]", " ", turn["user"]).split())
            assert (turn["status"], turn["reply"]) == ("succeeded", f"You said: {text}"), record


def turn_statuses(turn_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    with session_scope() as db:
        rows = db.execute(select(Turn.id, Turn.status).where(Turn.id.in_(turn_ids))).all()
    return {row.id: row.status.value for row in rows}


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:.0f}s: {what}")
        time.sleep(0.05)


def batch_turn_count(batch_id: str) -> int:
    with session_scope() as db:
        return db.execute(
            select(func.count(Turn.id))
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .where(ChatSession.metadata_["batch"].astext == batch_id)
        ).scalar_one()


def test_fifty_conversations_of_four_turns(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "convs.jsonl"
    lines = write_batch(source, 50, 4)
    out = tmp_path / "results.jsonl"
    result = chatq(batch_env, "batch", str(source), "--out", str(out))
    assert result.returncode == 0, result.stderr
    batch_id = default_batch_id(source)

    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in results) == sorted(str(line["id"]) for line in lines)
    prompt_sum = completion_sum = 0
    latencies = []
    for record in results:
        conv = next(line for line in lines if line["id"] == record["id"])
        assert [t["user"] for t in record["turns"]] == conv["turns"]
        assert all(t["status"] == "succeeded" and t["error"] is None for t in record["turns"])
        assert [t["reply"] for t in record["turns"]] == [f"You said: {text}" for text in conv["turns"]]
        for t in record["turns"]:
            prompt_sum += t["usage"]["prompt_tokens"]
            completion_sum += t["usage"]["completion_tokens"]
            latencies.append(t["latency_ms"])
        # The session's messages are the turns in order, each seeing the replies before it.
        stored = session_messages(uuid.UUID(record["session_id"]))
        assert [m.content for m in stored if m.role == "user"] == conv["turns"]
        assert [m.role for m in stored] == ["user", "assistant"] * 4

    with session_scope() as db:
        rows = db.execute(
            select(func.count(Turn.id), func.sum(Turn.prompt_tokens), func.sum(Turn.completion_tokens))
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .where(ChatSession.metadata_["batch"].astext == batch_id, Turn.status == "succeeded")
        ).one()
    assert rows == (200, prompt_sum, completion_sum)
    summary = result.stderr
    assert "conversations  50 ok, 0 failed" in summary
    assert "turns          200 ok, 0 failed" in summary
    assert f"tokens         {prompt_sum} in, {completion_sum} out" in summary
    assert f"max {max(latencies)} ms" in summary
    # Both workers took part.
    assert all("succeeded on attempt" in w.log() for w in two_workers)


def test_an_interrupted_batch_resumes_without_duplicates(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], batch_stub: HoldingStub, tmp_path: Path
) -> None:
    source = tmp_path / "resume.jsonl"
    hold = f"resume-{uuid.uuid4().hex[:12]}"
    # The last turn of conversations 10-19 waits for the test's release: Ctrl-C lands while they run.
    lines = write_batch(source, 20, 3)
    for line in lines[10:]:
        turns = cast(list[str], line["turns"])
        turns[-1] += f" [hold: {hold}]"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    first = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "batch", str(source), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, **batch_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    batch_id = default_batch_id(source)
    held = [turn_uuid(batch_id, f"conv-{c}", 2) for c in range(10, 20)]
    try:
        wait_until(
            lambda: batch_stub.waiting(hold) == 10 and len(result_ids(out)) == 10,
            timeout=90,
            what="10 conversations written and the other 10 held",
        )
    except AssertionError:
        first.kill()
        batch_stub.release(hold)
        raise
    first.send_signal(signal.SIGINT)  # Ctrl-C mid-batch
    _, err = first.communicate(timeout=30)
    # It was interrupted mid-batch: the held turns were still running when the follower stopped.
    assert {status for status in turn_statuses(held).values()} == {"running"}
    assert first.returncode == 130 and "Run the same command again to resume" in err, err
    assert sorted(result_ids(out)) == sorted(f"conv-{c}" for c in range(10))

    batch_stub.release(hold)
    second = chatq(batch_env, "batch", str(source), "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert "(0 new)" in second.stderr
    # The summary speaks of this run: it submitted nothing and found 50 (or, if the held ones were
    # quick, up to 60) turns done.
    resumed = re.search(r"resumed\s+0 submitted, (\d+) already done", second.stderr)
    assert resumed and 50 <= int(resumed.group(1)) <= 60, second.stderr
    ids = result_ids(out)
    assert sorted(ids) == sorted(f"conv-{c}" for c in range(20)) and len(ids) == len(set(ids))
    assert_pairs_each_text_with_its_reply(out)
    assert batch_turn_count(batch_id) == 60
    with session_scope() as db:
        replies = db.execute(
            select(func.count(ChatMessage.id))
            .join(ChatSession, ChatSession.id == ChatMessage.session_id)
            .where(ChatSession.metadata_["batch"].astext == batch_id, ChatMessage.role == "assistant")
        ).scalar_one()
    assert replies == 60


def test_running_a_finished_batch_again_reports_that_nothing_ran(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "again.jsonl"
    write_batch(source, 3, 2, extra="again")
    out = tmp_path / "results.jsonl"
    assert chatq(batch_env, "batch", str(source), "--out", str(out)).returncode == 0
    again = chatq(batch_env, "batch", str(source), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert re.search(r"resumed\s+0 submitted, 6 already done", again.stderr), again.stderr
    assert re.search(r"throughput\s+- \(no turn finished in this run\)", again.stderr), again.stderr
    assert "turns/s" not in again.stderr.split("turns          6 ok")[1]
    assert len(result_ids(out)) == 3


def run_then_edit(
    batch_env: dict[str, str],
    tmp_path: Path,
    name: str,
    edit: Callable[[list[list[str]]], None],
    *,
    same_out: bool = False,
) -> tuple[Path, str, subprocess.CompletedProcess[str], Path]:
    """Run a 3-conversation batch to its end, edit the file's turns, run it again (into a new results file)."""
    source = tmp_path / f"{name}.jsonl"
    lines = write_batch(source, 3, 2, extra=name)
    first = chatq(batch_env, "batch", str(source), "--out", str(tmp_path / "first.jsonl"))
    assert first.returncode == 0, first.stderr
    turns = [cast(list[str], line["turns"]) for line in lines]
    edit(turns)
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / ("first.jsonl" if same_out else "second.jsonl")
    second = chatq(batch_env, "batch", str(source), "--out", str(out), timeout=60)
    return source, default_batch_id(source), second, out


def test_a_changed_text_is_reported_and_not_run(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    def edit(turns: list[list[str]]) -> None:
        turns[1][1] = "a new question"

    source, batch_id, second, out = run_then_edit(batch_env, tmp_path, "edited", edit)
    assert second.returncode == 1, second.stderr
    assert "line 2: conversation 'conv-1' changed since this batch stored it" in second.stderr
    assert "turns[1] differs from the stored text" in second.stderr
    assert f"chatq batch {source} --batch-id NEW-NAME" in second.stderr
    assert "Traceback" not in second.stderr
    # The other conversations are there, each text with its own reply; conv-1 is not mislabelled.
    assert sorted(result_ids(out)) == ["conv-0", "conv-2"]
    assert_pairs_each_text_with_its_reply(out)
    stored = session_messages(session_uuid(batch_id, "conv-1"))
    assert [m.content for m in stored if m.role == "user"] == ["c1 t0 edited", "c1 t1 edited"]
    assert batch_turn_count(batch_id) == 6

    # As a new batch, the edited file runs in full.
    fresh = chatq(batch_env, "batch", str(source), "--batch-id", "edited-v2", "--out", str(tmp_path / "v2.jsonl"))
    assert fresh.returncode == 0, fresh.stderr
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "v2.jsonl").read_text().splitlines())}
    assert [t["user"] for t in records["conv-1"]["turns"]] == ["c1 t0 edited", "a new question"]
    assert_pairs_each_text_with_its_reply(tmp_path / "v2.jsonl")


def test_an_appended_turn_runs_after_the_stored_ones(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], batch_stub: HoldingStub, tmp_path: Path
) -> None:
    def edit(turns: list[list[str]]) -> None:
        turns[2].append("one more question")

    _, batch_id, second, out = run_then_edit(batch_env, tmp_path, "appended", edit, same_out=True)
    assert second.returncode == 0, second.stderr
    assert "line 3: conversation 'conv-2': 1 turn(s) appended; they run after the 2 stored" in second.stderr
    assert "(1 new)" in second.stderr
    # The first run's three lines, then conv-2 again with all its turns.
    ids = result_ids(out)
    assert sorted(ids[:3]) == ["conv-0", "conv-1", "conv-2"] and ids[3:] == ["conv-2"]
    assert_pairs_each_text_with_its_reply(out)
    record = json.loads(out.read_text().splitlines()[3])
    assert [t["user"] for t in record["turns"]] == ["c2 t0 appended", "c2 t1 appended", "one more question"]
    stored = session_messages(session_uuid(batch_id, "conv-2"))
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    assert [m.content for m in stored if m.role == "user"] == record_users(record)
    # The new turn ran with the stored turns as its history.
    request = next(
        r for r in batch_stub.requests if r.get("messages") and r["messages"][-1].get("content") == "one more question"
    )
    assert [m["content"] for m in request["messages"] if m["role"] == "user"][-3:] == record_users(record)


def test_a_removed_turn_is_reported_and_not_run(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    def edit(turns: list[list[str]]) -> None:
        del turns[0][1]

    _, batch_id, second, out = run_then_edit(batch_env, tmp_path, "removed", edit)
    assert second.returncode == 1, second.stderr
    assert "line 1: conversation 'conv-0' changed since this batch stored it" in second.stderr
    assert "1 turn(s) removed: 2 were stored" in second.stderr
    assert "--batch-id NEW-NAME" in second.stderr
    assert sorted(result_ids(out)) == ["conv-1", "conv-2"]
    assert_pairs_each_text_with_its_reply(out)
    assert "conversations  2 ok, 0 failed, 1 not run (changed)" in second.stderr
    assert re.search(r"resumed\s+0 submitted, 4 already done", second.stderr), second.stderr
    assert batch_turn_count(batch_id) == 6


def test_an_interactive_turn_starts_before_a_big_batch_drains(
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "big.jsonl"
    write_batch(source, 125, 4, extra="[slow: 0.01] [words: 4]")
    submitted = chatq(batch_env, "batch", str(source), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = default_batch_id(source)
    time.sleep(1.0)  # the batch is under way
    session_id = create_session(framework="none", model=STUB_MODEL)
    clicked = time.monotonic()
    turn = submit_turn(session_id, "interactive question")
    row = wait_for_turn(turn.turn_id, timeout=120)
    waited = time.monotonic() - clicked
    with session_scope() as db:
        left = db.execute(
            select(func.count(Turn.id))
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .where(ChatSession.metadata_["batch"].astext == batch_id, Turn.status.in_(("queued", "running")))
        ).scalar_one()
    print(f"interactive turn finished {waited:.2f}s after submit with {left} of 500 batch turns still unfinished")
    assert row.status.value == "succeeded"
    assert left > 0, "the interactive turn waited for the whole batch"
    # Wait for the batch to finish so later tests get idle workers.
    chatq(batch_env, "batch", str(source), "--poll", "0.5")


def test_invalid_lines_are_reported_with_line_numbers_and_nothing_is_submitted(
    batch_env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(
        '{"id": "ok-1", "turns": ["hello"]}\n'
        "this is not json\n"
        '{"id": "no-turns"}\n'
        '{"id": "empty", "turns": ["fine", "  "]}\n'
        '{"id": "fw", "session": {"framework": "autogen"}, "turns": ["x"]}\n'
        '{"id": "ok-1", "turns": ["duplicate"]}\n'
    )
    result = chatq(batch_env, "batch", str(source))
    assert result.returncode == 1
    err = result.stderr
    assert "line 2: not valid JSON" in err
    assert 'line 3: missing "turns"' in err
    assert "line 4: turns[1]: content is empty" in err
    assert "line 5: unknown framework 'autogen'" in err
    assert "line 6: duplicate id 'ok-1'" in err
    assert "nothing was submitted" in err and "Traceback" not in err
    batch_id = default_batch_id(source)
    assert batch_turn_count(batch_id) == 0
    with session_scope() as db:
        assert db.get(ChatSession, session_uuid(batch_id, "ok-1")) is None
        assert db.get(Turn, turn_uuid(batch_id, "ok-1", 0)) is None

    skipped = chatq(batch_env, "batch", str(source), "--skip-invalid", "--no-wait")
    assert skipped.returncode == 0, skipped.stderr
    assert batch_turn_count(batch_id) == 1

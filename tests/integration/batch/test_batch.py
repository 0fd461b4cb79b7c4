"""`chatq batch` end to end: real CLI subprocesses, two real workers, the model stub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn
from tests.support.cli import chatq
from tests.support.turns import session_messages, wait_for_turn
from tests.support.workers import ROOT, WorkerProcess
from worker.batch import session_uuid, turn_uuid
from worker.batch_cli import default_batch_id
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
    two_workers: list[WorkerProcess], batch_env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "resume.jsonl"
    # Conversation c streams 2+3c words: they finish one after another, so Ctrl-C lands halfway.
    write_batch(source, 20, 3, extra="[slow: 0.04]", staggered=True)
    out = tmp_path / "results.jsonl"
    first = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "batch", str(source), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, **batch_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)  # Ctrl-C halfway
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130 and "Run the same command again to resume" in err, err
    written_before = len(out.read_text().splitlines())
    assert 0 < written_before < 20

    second = chatq(batch_env, "batch", str(source), "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert "(0 new)" in second.stderr
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"conv-{c}" for c in range(20)) and len(ids) == len(set(ids))
    batch_id = default_batch_id(source)
    assert batch_turn_count(batch_id) == 60
    with session_scope() as db:
        replies = db.execute(
            select(func.count(ChatMessage.id))
            .join(ChatSession, ChatSession.id == ChatMessage.session_id)
            .where(ChatSession.metadata_["batch"].astext == batch_id, ChatMessage.role == "assistant")
        ).scalar_one()
    assert replies == 60


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

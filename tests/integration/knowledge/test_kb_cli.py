"""`chatq kb ...` as a user runs it, against the test database: its `main` in this process
(`tests.support.cli.chatq_here`), and the core of the first test as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.knowledge import session_knowledge_bases
from models.tables import ChatSession
from tests.support.cli import chatq, chatq_here
from tests.support.factories import create_session
from tests.support.knowledge import REFUNDS, SHIPPING


def _ok(env: dict[str, str], *args: str) -> str:
    result = chatq_here(env, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 1
    assert result.stderr.startswith("chatq: error: ") and fragment in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.fixture
def kb(chatq_env: dict[str, str]) -> str:
    name = f"docs-{uuid.uuid4().hex[:8]}"
    assert _ok(chatq_env, "kb", "create", name).strip() == f"knowledge base {name!r} created"
    return name


@pytest.mark.slow  # `chatq kb add` and `kb search` as real subprocesses
def test_create_add_search(chatq_env: dict[str, str], kb: str, tmp_path: Path) -> None:
    refunds, shipping = tmp_path / "refunds.md", tmp_path / "shipping.txt"
    refunds.write_text(REFUNDS)
    shipping.write_text(SHIPPING)
    added = chatq(chatq_env, "kb", "add", kb, str(refunds), str(shipping))
    assert added.returncode == 0, added.stderr
    lines = added.stdout.splitlines()
    assert lines[0].startswith("added") and "'Refund policy'  (2 chunks)" in lines[0]
    assert lines[1].startswith("added") and "'shipping'  (1 chunk)" in lines[1]

    searched = chatq(chatq_env, "kb", "search", kb, "express shipping")
    assert searched.returncode == 0, searched.stderr
    found = searched.stdout.splitlines()
    assert found[0].startswith("1. shipping  (document ")
    assert "**Express** **shipping**" in found[1]

    data = json.loads(_ok(chatq_env, "kb", "search", kb, "damaged refund", "--json", "--limit", "1"))
    assert data["knowledge_base"] == kb and data["query"] == "damaged refund"
    (hit,) = data["results"]
    assert hit["title"] == "Refund policy" and hit["all_terms"] is True
    assert set(hit) == {"document_id", "title", "chunk_id", "position", "rank", "all_terms", "snippet", "source_path"}
    assert hit["source_path"] == str(refunds.resolve())

    assert _ok(chatq_env, "kb", "search", kb, "quantum").strip() == "no matching passages"
    listed = {row["name"]: row for row in json.loads(_ok(chatq_env, "kb", "list", "--json"))}
    assert (listed[kb]["documents"], listed[kb]["chunks"]) == (2, 3)


def test_adding_the_same_file_again_updates_it(chatq_env: dict[str, str], kb: str, tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe first version.\n")
    first = json.loads(_ok(chatq_env, "kb", "add", kb, str(note), "--json"))["documents"][0]
    again = json.loads(_ok(chatq_env, "kb", "add", kb, str(note), "--json"))["documents"][0]
    assert (first["status"], again["status"]) == ("added", "unchanged")
    note.write_text("# Note\n\nThe second version, rewritten.\n")
    updated = json.loads(_ok(chatq_env, "kb", "add", kb, str(note), "--json"))["documents"][0]
    assert updated["status"] == "updated" and updated["document_id"] == first["document_id"]
    assert json.loads(_ok(chatq_env, "kb", "search", kb, "first", "--json"))["results"] == []
    assert len(json.loads(_ok(chatq_env, "kb", "search", kb, "rewritten", "--json"))["results"]) == 1


def test_errors_are_one_line(chatq_env: dict[str, str], kb: str, tmp_path: Path) -> None:
    _one_line_error(chatq_here(chatq_env, "kb", "add", kb, str(tmp_path / "missing.md")), "file not found:")
    _one_line_error(chatq_here(chatq_env, "kb", "add", "no-such-kb", str(tmp_path)), "not a file")
    good = tmp_path / "good.md"
    good.write_text("hello")
    _one_line_error(chatq_here(chatq_env, "kb", "add", "no-such-kb", str(good)), "unknown knowledge base: no-such-kb")
    _one_line_error(chatq_here(chatq_env, "kb", "search", "no-such-kb", "x"), "unknown knowledge base: no-such-kb")
    _one_line_error(chatq_here(chatq_env, "kb", "create", kb), "already exists")
    _one_line_error(chatq_here(chatq_env, "kb", "search", kb, "x", "--limit", "0"), "--limit must be between 1 and 50")
    _one_line_error(chatq_here(chatq_env, "kb", "attach", str(uuid.uuid4()), kb), "does not exist")
    _one_line_error(chatq_here(chatq_env, "kb", "attach", "not-a-session", kb), "not a session id")
    usage = chatq_here(chatq_env, "kb")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_attach_and_detach(chatq_env: dict[str, str], kb: str) -> None:
    session_id = create_session()
    out = _ok(chatq_env, "kb", "attach", str(session_id), kb)
    assert out.strip() == f"session {session_id} knowledge bases: {kb}"
    assert session_knowledge_bases(session_id) == [kb]
    attached = chatq_here(chatq_env, "kb", "attach", str(session_id), "nope-kb")
    _one_line_error(attached, "unknown knowledge base: nope-kb")
    data = json.loads(_ok(chatq_env, "kb", "detach", str(session_id), kb, "--json"))
    assert data == {"session_id": str(session_id), "knowledge_bases": []}


def test_session_create_attaches_knowledge_bases(chatq_env: dict[str, str], kb: str) -> None:
    session_id = _ok(chatq_env, "session", "create", "--model", "echo", "--kb", kb).strip()
    assert session_knowledge_bases(session_id) == [kb]
    before = _sessions()
    _one_line_error(chatq_here(chatq_env, "session", "create", "--kb", kb, "--kb", "nope-kb"), "unknown knowledge base")
    assert _sessions() == before  # a typo creates no session


def _sessions() -> int:
    with session_scope() as db:
        return int(db.scalar(select(func.count()).select_from(ChatSession)) or 0)

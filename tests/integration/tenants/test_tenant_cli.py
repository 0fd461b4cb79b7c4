"""A session's tenant from the command line: `session create --tenant`, `submit --tenant`, `batch
--tenant` and a batch line's own `"tenant"`, shown by `session show` and `show` (text and JSON).
A bad name is a usage error (exit 2) and stores nothing; a turn for another tenant's session is an
error (exit 1) and stores nothing.

Each command's `main` runs in this process (`chatq_here`) against the real Postgres and Redis; no
worker runs here, the submitted turns stay queued.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatSession, Schedule, Turn
from tests.support.cli import chatq_here
from worker.cli.batch import session_uuid

pytestmark = pytest.mark.usefixtures("drop_sent_messages")  # no worker runs these turns

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"


def _counts() -> tuple[int, int]:
    with session_scope() as db:
        sessions = db.execute(select(func.count()).select_from(ChatSession)).scalar_one()
        turns = db.execute(select(func.count()).select_from(Turn)).scalar_one()
    return sessions, turns


def _tenant_of(session_id: uuid.UUID | str) -> str | None:
    with session_scope() as db:
        row = db.get(ChatSession, uuid.UUID(str(session_id)))
        assert row is not None
        return row.tenant


def _one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chatq: error: "), stderr
    return lines[0]


def _session(env: dict[str, str], tenant: str) -> str:
    created = chatq_here(env, "session", "create", "--framework", "none", "--tenant", tenant, "--json")
    assert created.returncode == 0, created.stderr
    session_id: str = json.loads(created.stdout)["session_id"]
    return session_id


def test_session_create_stores_the_tenant_and_show_prints_it(chatq_env: dict[str, str]) -> None:
    session_id = _session(chatq_env, ACME)
    assert _tenant_of(session_id) == ACME
    shown = chatq_here(chatq_env, "session", "show", session_id, "--json")
    assert json.loads(shown.stdout)["tenant"] == ACME
    text = chatq_here(chatq_env, "session", "show", session_id)
    assert f"tenant         {ACME}\n" in text.stdout
    plain = chatq_here(chatq_env, "session", "create", "--framework", "none")
    assert plain.returncode == 0 and _tenant_of(plain.stdout.strip()) is None


@pytest.mark.parametrize("bad", ["acme corp", "", ".acme", "x" * 65])
def test_a_bad_tenant_name_is_a_usage_error_and_stores_nothing(chatq_env: dict[str, str], bad: str) -> None:
    session_id = _session(chatq_env, ACME)
    before = _counts()
    commands = [
        ("session", "create", "--framework", "none", "--tenant", bad),
        ("submit", session_id, "hello", "--tenant", bad),
    ]
    for command in commands:
        result = chatq_here(chatq_env, *command)
        assert result.returncode == 2, (command, result.stderr)
        assert "is not a tenant name" in _one_line_error(result.stderr)
        assert _counts() == before, f"{command[0]} stored something"


def test_submit_with_the_tenant_stores_and_show_prints_the_turns_tenant(chatq_env: dict[str, str]) -> None:
    session_id = _session(chatq_env, ACME)
    submitted = chatq_here(chatq_env, "submit", session_id, "hello", "--tenant", ACME, "--json")
    assert submitted.returncode == 0, submitted.stderr
    turn_id = json.loads(submitted.stdout)["turn_id"]
    report = json.loads(chatq_here(chatq_env, "show", turn_id, "--json").stdout)
    assert (report["id"], report["session_id"], report["tenant"]) == (turn_id, session_id, ACME)
    assert report["status"] == "queued"
    text = chatq_here(chatq_env, "show", turn_id).stdout
    assert f"\ntenant   {ACME}\n" in text
    # A turn of a session of no tenant shows none.
    plain = chatq_here(chatq_env, "session", "create", "--framework", "none").stdout.strip()
    other = chatq_here(chatq_env, "submit", plain, "hi").stdout.strip()
    assert json.loads(chatq_here(chatq_env, "show", other, "--json").stdout)["tenant"] is None
    assert "tenant" not in chatq_here(chatq_env, "show", other).stdout


def test_submit_for_another_tenants_session_fails_and_stores_nothing(chatq_env: dict[str, str]) -> None:
    session_id = _session(chatq_env, ACME)
    before = _counts()
    refused = chatq_here(chatq_env, "submit", session_id, "hello", "--tenant", GLOBEX)
    assert refused.returncode == 1
    line = _one_line_error(refused.stderr)
    assert f"belongs to tenant {ACME!r}, not to tenant {GLOBEX!r}" in line
    assert _counts() == before


def _batch_file(tmp_path: Path, *lines: dict[str, object]) -> Path:
    path = tmp_path / "conversations.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_batch_tenant_is_every_sessions_unless_the_line_names_its_own(
    chatq_env: dict[str, str], tmp_path: Path
) -> None:
    source = _batch_file(
        tmp_path,
        {"id": "plain", "session": {"framework": "none"}, "turns": ["one"]},
        {"id": "own", "tenant": GLOBEX, "session": {"framework": "none"}, "turns": ["two"]},
    )
    batch_id = f"tenants-{SUFFIX}"
    done = chatq_here(chatq_env, "batch", str(source), "--tenant", ACME, "--batch-id", batch_id, "--no-wait")
    assert done.returncode == 0, done.stderr
    assert _tenant_of(session_uuid(batch_id, "plain")) == ACME
    assert _tenant_of(session_uuid(batch_id, "own")) == GLOBEX
    # Without the flag the file is another batch's: its plain line has no tenant.
    other = f"untenanted-{SUFFIX}"
    assert chatq_here(chatq_env, "batch", str(source), "--batch-id", other, "--no-wait").returncode == 0
    assert _tenant_of(session_uuid(other, "plain")) is None
    assert _tenant_of(session_uuid(other, "own")) == GLOBEX
    # Run again under another tenant, the batch's stored conversation is a change: not run.
    rerun = chatq_here(chatq_env, "batch", str(source), "--tenant", GLOBEX, "--batch-id", batch_id, "--no-wait")
    assert rerun.returncode == 1
    assert f"changed since this batch stored it (tenant was {ACME!r})" in rerun.stderr
    assert _tenant_of(session_uuid(batch_id, "plain")) == ACME


def test_a_bad_tenant_in_a_batch_stores_nothing(chatq_env: dict[str, str], tmp_path: Path) -> None:
    source = _batch_file(
        tmp_path,
        {"id": "fine", "session": {"framework": "none"}, "turns": ["one"]},
        {"id": "bad", "tenant": "acme corp", "session": {"framework": "none"}, "turns": ["two"]},
    )
    before = _counts()
    refused = chatq_here(chatq_env, "batch", str(source), "--batch-id", f"bad-{SUFFIX}", "--no-wait")
    assert refused.returncode == 1
    assert f"chatq: {source}: line 2: tenant 'acme corp' is not a tenant name" in refused.stderr
    assert "nothing was submitted" in refused.stderr
    assert _counts() == before
    flag = chatq_here(chatq_env, "batch", str(source), "--tenant", "a,b", "--no-wait")
    assert flag.returncode == 2 and "is not a tenant name" in _one_line_error(flag.stderr)
    assert _counts() == before


def test_schedule_add_tenant_owns_the_schedule_and_its_new_sessions(chatq_env: dict[str, str]) -> None:
    added = chatq_here(chatq_env, "schedule", "add", "tick", "--framework", "none", "--every", "3600", "--tenant", ACME)
    assert added.returncode == 0, added.stderr
    schedule = json.loads(chatq_here(chatq_env, "schedule", "show", added.stdout.split()[0], "--json").stdout)
    assert schedule["tenant"] == ACME
    session_id = _session(chatq_env, ACME)
    before = _schedules()
    bad = chatq_here(chatq_env, "schedule", "add", "tick", "--every", "3600", "--tenant", "a b")
    assert bad.returncode == 2 and "is not a tenant name" in _one_line_error(bad.stderr)
    on_session = chatq_here(
        chatq_env, "schedule", "add", "tick", "--session", session_id, "--every", "60", "--tenant", ACME
    )
    assert on_session.returncode == 1 and "takes that session's tenant" in _one_line_error(on_session.stderr)
    assert _schedules() == before, "a refused schedule was stored"


def _schedules() -> int:
    with session_scope() as db:
        return int(db.execute(select(func.count()).select_from(Schedule)).scalar_one())

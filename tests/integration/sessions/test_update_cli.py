"""`chatq session create --metadata` and `chatq session update`, run in-process against the real Postgres."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest

from models.knowledge import create_knowledge_base
from worker.cli.commands import main
from worker.producer import create_session, get_session

pytestmark = pytest.mark.usefixtures("chatq_env")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`chatq ARGS...` in this process: exit code, stdout, stderr (usage errors exit through SystemExit)."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def shown(capsys: pytest.CaptureFixture[str], session_id: str) -> dict[str, Any]:
    code, out, err = run(capsys, "session", "show", session_id, "--json")
    assert code == 0, err
    return dict(json.loads(out))


def test_metadata_set_at_creation_is_what_session_list_filters_on(capsys: pytest.CaptureFixture[str]) -> None:
    label = uuid.uuid4().hex
    code, out, err = run(
        capsys, "session", "create", "--model", "echo", "--metadata", f"label={label}", "--metadata", "user=u=42"
    )
    assert code == 0, err
    session_id = out.strip()
    create_session(framework="none", metadata={"label": "other"})
    code, out, err = run(capsys, "session", "list", "--metadata", f"label={label}", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["sessions"]
    assert found["id"] == session_id
    assert found["metadata"] == {"label": label, "user": "u=42"}, "the value is everything after the first ="

    code, out, err = run(capsys, "session", "create", "--metadata", "no-equals-sign")
    assert (code, out) == (1, "")
    assert err == "chatq: error: --metadata takes KEY=VALUE, got 'no-equals-sign'\n"


def test_update_changes_each_field_and_keeps_the_others(capsys: pytest.CaptureFixture[str]) -> None:
    kb = f"kb-{uuid.uuid4().hex[:10]}"
    create_knowledge_base(kb)
    session_id = str(create_session(framework="none", model="echo", system_prompt="old", metadata={"a": "1"}))

    code, out, err = run(
        capsys,
        "session",
        "update",
        session_id,
        "--system-prompt",
        "Be brief.",
        "--metadata",
        "user=u42",
        "--metadata",
        "team=",
        "--kb",
        kb,
        "--webhook",
        "https://example.com/hook?token=t",
    )
    assert code == 0, err
    assert f"session        {session_id}" in out and "system prompt  Be brief." in out
    assert "webhook        https://example.com/hook?token=t" in out
    session = shown(capsys, session_id)
    assert session["model"] == "echo", "a field not given stays"
    assert session["system_prompt"] == "Be brief."
    assert session["metadata"] == {"user": "u42", "team": ""}, "--metadata replaces the metadata, as PATCH does"
    assert session["knowledge_bases"] == [kb]
    assert session["webhook"] == "https://example.com/hook?token=t"

    code, out, err = run(capsys, "session", "update", session_id, "--model", "gpt-4o-mini", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "gpt-4o-mini" and json.loads(out)["knowledge_bases"] == [kb]

    code, out, err = run(
        capsys,
        "session",
        "update",
        session_id,
        "--default-model",
        "--no-system-prompt",
        "--no-metadata",
        "--no-kb",
        "--no-webhook",
    )
    assert code == 0, err
    session = shown(capsys, session_id)
    assert (session["model"], session["system_prompt"], session["metadata"]) == (None, None, {})
    assert (session["knowledge_bases"], session["webhook"]) == ([], None)


def test_update_refuses_bad_input_in_one_line_and_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    session_id = str(create_session(framework="none", model="echo", system_prompt="keep me", metadata={"a": "1"}))
    before = get_session(session_id)

    cases = [
        (("--system-prompt", "new", "--kb", "no-such-kb"), "no-such-kb"),
        (("--metadata", "a=2", "--webhook", "http://10.1.2.3/hook"), "private address"),
        (("--metadata", "oops"), "--metadata takes KEY=VALUE, got 'oops'"),
        (("--webhook", "ftp://example.com/x"), "http:// or https://"),
        ((), "nothing to change: give --model"),
    ]
    for extra, why in cases:
        code, out, err = run(capsys, "session", "update", session_id, *extra)
        assert (code, out) == (1, ""), extra
        assert err.startswith("chatq: error: ") and why in err and err.count("\n") == 1, err
    assert get_session(session_id) == before

    unknown = uuid.uuid4()
    code, _, err = run(capsys, "session", "update", str(unknown), "--model", "echo")
    assert (code, err) == (1, f"chatq: error: session {unknown} does not exist\n")
    code, _, err = run(capsys, "session", "update", session_id, "--model", "echo", "--default-model")
    assert code == 2 and "not allowed with argument" in err and err.count("\n") == 1
    assert get_session(session_id) == before


def test_update_warns_about_a_model_this_terminal_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    from chatq.settings import reset_settings

    session_id = str(create_session(framework="none", model="echo"))
    saved = {name: os.environ.pop(name, None) for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    reset_settings()
    try:
        code, _, err = run(capsys, "session", "update", session_id, "--model", "gpt-4o-mini")
    finally:
        os.environ.update({name: value for name, value in saved.items() if value is not None})
        reset_settings()
    assert code == 0
    assert err.startswith("chatq: warning: model 'gpt-4o-mini' needs OPENAI_API_KEY or OPENAI_BASE_URL")
    assert get_session(session_id)["model"] == "gpt-4o-mini", "only a warning: the worker may have the key"

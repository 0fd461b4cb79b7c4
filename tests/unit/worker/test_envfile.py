"""`.env`-style files: the format the `chatq` command reads, the order of the files, placeholders."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.envfile import (
    ENV_FILES,
    env_files,
    is_placeholder,
    load_env_files,
    parse_env_text,
    read_env_files,
    services_notice,
)
from worker.errors import ConfigError


def test_the_common_dotenv_format() -> None:
    text = "\n".join(
        [
            "# a comment",
            "",
            "PLAIN=value",
            "export EXPORTED=yes",
            "  SPACED = around  ",
            "EMPTY=",
            "INLINE=value # a comment",
            "HASH=a#b",
            "SINGLE='kept # as $is'",
            'DOUBLE="line\\nbreak \\"quoted\\" \\\\ end"  # comment',
            "URL=postgresql+psycopg://user:p%40ss@db:5432/chatq?sslmode=require",
            "REPEATED=first",
            "REPEATED=second",
        ]
    )
    assert parse_env_text(text, source=".env") == {
        "PLAIN": "value",
        "EXPORTED": "yes",
        "SPACED": "around",
        "EMPTY": "",
        "INLINE": "value",
        "HASH": "a#b",
        "SINGLE": "kept # as $is",
        "DOUBLE": 'line\nbreak "quoted" \\ end',
        "URL": "postgresql+psycopg://user:p%40ss@db:5432/chatq?sslmode=require",
        "REPEATED": "second",
    }


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("no equals sign", "line 2: expected NAME=value"),
        ("1ABC=x", "line 2: expected NAME=value"),
        ('OPEN="never closed', "line 2: a double-quoted value must close"),
        ("OPEN='never closed", "line 2: a single-quoted value must close"),
        ('AFTER="quoted" trailing', "line 2: a double-quoted value must close on its line, followed by nothing"),
    ],
)
def test_a_bad_line_is_one_clear_error_naming_file_and_line(line: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_env_text(f"GOOD=1\n{line}\n", source=".env")
    assert caught.value.message.startswith(f".env {problem}")
    assert "\n" not in caught.value.message


def _write(directory: Path, relative: str, text: str) -> None:
    path = directory / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_dotenv_wins_over_services_env_and_the_environment_over_both(tmp_path: Path) -> None:
    _write(tmp_path, ".env", "A=from-dotenv\nB=from-dotenv\n")
    _write(tmp_path, ".local/services.env", "B=from-services\nC=from-services\nD=from-services\n")
    assert read_env_files(tmp_path) == {
        "A": "from-dotenv",
        "B": "from-dotenv",
        "C": "from-services",
        "D": "from-services",
    }
    environ = {"C": "from-environment", "D": ""}
    filled = load_env_files(environ, tmp_path)
    # A variable set in the environment, even to "", is the user's choice: the files never change it.
    assert environ == {"A": "from-dotenv", "B": "from-dotenv", "C": "from-environment", "D": ""}
    assert sorted(filled) == ["A", "B"]


def test_no_files_change_nothing(tmp_path: Path) -> None:
    environ = {"KEEP": "1"}
    assert load_env_files(environ, tmp_path) == []
    assert environ == {"KEEP": "1"}


@pytest.mark.parametrize(
    ("value", "placeholder"),
    [
        ("change-me-gateway-token-0123456789", True),
        ("change-me-flower", True),
        ("  Change-Me-too", True),
        ("3f9c0a8e1b7d4c2a9e6f", False),
        ("", False),
        ("please-change-me", False),
    ],
)
def test_placeholders_of_env_example(value: str, placeholder: bool) -> None:
    assert is_placeholder(value) is placeholder


def test_env_example_secrets_are_all_placeholders() -> None:
    """What the refusals rely on: every secret .env.example ships starts with `change-me`."""
    example = parse_env_text((Path(__file__).resolve().parents[3] / ".env.example").read_text(), source=".env.example")
    assert is_placeholder(example["CHATQ_API_TOKEN"])
    assert is_placeholder(example["FLOWER_BASIC_AUTH"].partition(":")[2])
    assert is_placeholder(example["POSTGRES_PASSWORD"]) and is_placeholder(example["REDIS_PASSWORD"])


def test_make_runs_notice_says_whether_another_terminal_reaches_the_same_services(tmp_path: Path) -> None:
    urls = {
        "DATABASE_URL": "postgresql+psycopg://postgres:pw@127.0.0.1:55444/chatq",
        "REDIS_URL": "redis://127.0.0.1:56384/0",
    }
    _write(tmp_path, ".local/services.env", "".join(f"{k}={v}\n" for k, v in urls.items()))
    notice = services_notice(urls, tmp_path)
    assert "127.0.0.1:55444" in notice and "pw" not in notice
    assert "a second terminal in this directory reaches them too" in notice
    # A .env here (e.g. docker compose's) wins in another terminal: say so, and what to do.
    _write(tmp_path, ".env", "DATABASE_URL=postgresql+psycopg://chatq:secret@postgres:5432/chatq\n")
    notice = services_notice(urls, tmp_path)
    assert "reaches them too" not in notice
    assert "postgres:5432" in notice and "from .env" in notice and "export DATABASE_URL" in notice
    assert "secret" not in notice


def test_chatq_env_files_replaces_the_list(tmp_path: Path) -> None:
    assert env_files({}) == ENV_FILES
    assert env_files({"CHATQ_ENV_FILES": ""}) == ()
    assert env_files({"CHATQ_ENV_FILES": " a.env, ,/etc/chatq.env "}) == (Path("a.env"), Path("/etc/chatq.env"))
    _write(tmp_path, ".env", "A=dotenv\n")
    _write(tmp_path, "mine.env", "A=mine\nB=mine\n")
    environ = {"CHATQ_ENV_FILES": "mine.env"}
    load_env_files(environ, tmp_path)
    assert environ == {"CHATQ_ENV_FILES": "mine.env", "A": "mine", "B": "mine"}
    environ = {"CHATQ_ENV_FILES": ""}
    assert load_env_files(environ, tmp_path) == []

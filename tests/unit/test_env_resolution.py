"""One resolution of configuration: the settings themselves apply `.env` and `.local/services.env`.

So the Python API, `celery -A worker`, the gateway and Flower see what the `chatq` command sees;
the exported environment always wins; `CHATQ_ENV_FILES=""` (the suite's, tests/conftest.py) reads
no file at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatq.gateway_variables import load_gateway_variables
from chatq.settings import DEFAULT_DATABASE_URL, load_settings

RECORDED = "postgresql+psycopg://postgres@127.0.0.1:55432/recorded"
DOTENV = "postgresql+psycopg://postgres@127.0.0.1:55433/dotenv"
EXPORTED = "postgresql+psycopg://postgres@127.0.0.1:55434/exported"


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch checkout as the current directory, with services.env recorded and no URL exported.

    Every variable the files may fill is registered with monkeypatch first, so what the settings
    write into os.environ is undone after the test.
    """
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "services.env").write_text(
        f"DATABASE_URL='{RECORDED}'\nREDIS_URL='redis://127.0.0.1:56379/0'\n"
    )
    monkeypatch.chdir(tmp_path)
    for name in ("DATABASE_URL", "REDIS_URL", "CHATQ_ENV_FILES", "CHATQ_SSE_HEARTBEAT"):
        # setenv first: monkeypatch then restores the variable (or its absence) whatever the test wrote.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return tmp_path


def test_settings_read_services_env_without_any_exports(checkout: Path) -> None:
    settings = load_settings()
    assert settings.database_url == RECORDED
    assert settings.redis_url == "redis://127.0.0.1:56379/0"
    # Into the environment itself, so what this process starts (Celery's children) sees the same.
    assert os.environ["DATABASE_URL"] == RECORDED


def test_dotenv_before_services_env_and_the_environment_before_both(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (checkout / ".env").write_text(f"DATABASE_URL={DOTENV}\nCHATQ_SSE_HEARTBEAT=2\n")
    assert load_settings().database_url == DOTENV
    assert load_gateway_variables(token_required=False).sse_heartbeat == 2.0
    monkeypatch.setenv("DATABASE_URL", EXPORTED)
    monkeypatch.setenv("CHATQ_SSE_HEARTBEAT", "3")
    assert load_settings().database_url == EXPORTED
    assert load_gateway_variables(token_required=False).sse_heartbeat == 3.0


def test_chatq_env_files_empty_reads_nothing(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (checkout / ".env").write_text(f"DATABASE_URL={DOTENV}\n")
    monkeypatch.setenv("CHATQ_ENV_FILES", "")
    assert load_settings().database_url == DEFAULT_DATABASE_URL
    assert "DATABASE_URL" not in os.environ


def test_an_explicit_mapping_is_parsed_as_given(checkout: Path) -> None:
    """`load_settings(env)` with a mapping of its own reads no file (tests and tools pass one)."""
    assert load_settings({}).database_url == DEFAULT_DATABASE_URL
    assert "DATABASE_URL" not in os.environ


def test_what_the_files_filled_is_gone_after_each_test() -> None:
    """The fixture's promise, checked from a test after those above (the suite reads no env file)."""
    assert os.environ.get("DATABASE_URL") != RECORDED
    assert os.environ.get("DATABASE_URL") != DOTENV

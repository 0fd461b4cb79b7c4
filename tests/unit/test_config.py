from __future__ import annotations

import pytest

from worker.config import ECHO_MODEL, load_settings, mask_secrets, mask_url
from worker.errors import ConfigError


def test_defaults_use_echo_without_a_key() -> None:
    settings = load_settings({})
    assert settings.default_model == ECHO_MODEL
    assert settings.database_url == "postgresql+psycopg://postgres@localhost:5432/chatq"
    assert settings.turn_timeout == 120.0
    assert settings.max_content_chars == 100_000


def test_key_switches_the_default_model_and_is_not_in_repr() -> None:
    settings = load_settings({"OPENAI_API_KEY": "sk-secret"})
    assert settings.default_model != ECHO_MODEL
    assert "sk-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"CHATQ_TURN_TIMEOUT": "soon"}, "CHATQ_TURN_TIMEOUT must be a number"),
        ({"CHATQ_MAX_CONTENT_CHARS": "0"}, "CHATQ_MAX_CONTENT_CHARS must be at least 1"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL must start with"),
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL must start with"),
        ({"OPENAI_BASE_URL": "ftp://x"}, "OPENAI_BASE_URL must be an http(s) URL"),
    ],
)
def test_bad_values_fail_with_one_clear_line(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_libpq_urls_are_mapped_to_psycopg3() -> None:
    assert load_settings({"DATABASE_URL": "postgresql://u@h/db"}).database_url == "postgresql+psycopg://u@h/db"


def test_passwords_are_masked() -> None:
    assert mask_url("rediss://:hunter2@cache:6380/0") == "rediss://:***@cache:6380/0"
    assert mask_url("redis://localhost:6379/0") == "redis://localhost:6379/0"
    line = "cannot reach redis://user:hunter2@cache:6379/0 or postgresql+psycopg://pg:pw@db/x"
    masked = mask_secrets(line)
    assert "hunter2" not in masked and ":pw@" not in masked
    assert "rediss://:***@" in mask_secrets("rediss://:hunter2@cache:6380/0")

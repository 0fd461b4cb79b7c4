from __future__ import annotations

import pytest

from chatq.masking import mask_secrets, mask_url
from chatq.settings import ECHO_MODEL, load_settings
from tests.support.env import environ
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
        ({"CHATQ_METRICS_PORT": "nine"}, "CHATQ_METRICS_PORT must be a port number"),
        ({"CHATQ_METRICS_PORT": "70000"}, "CHATQ_METRICS_PORT must be a port number"),
        ({"CHATQ_METRICS_ADDR": "every where"}, "CHATQ_METRICS_ADDR must be an IP address"),
        ({"CHATQ_WORKER_SWEEP": "sometimes"}, "CHATQ_WORKER_SWEEP must be on or off"),
        ({"CHATQ_THREAD_SHARE": "maybe"}, "CHATQ_THREAD_SHARE must be on or off"),
    ],
)
def test_bad_values_fail_with_one_clear_line(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("raw", "on"), [(None, True), ("on", True), ("OFF", False), ("0", False), ("true", True)])
def test_the_in_worker_sweep_is_on_unless_switched_off(raw: str | None, on: bool) -> None:
    assert load_settings({} if raw is None else {"CHATQ_WORKER_SWEEP": raw}).worker_sweep is on


@pytest.mark.parametrize(("raw", "on"), [(None, True), ("on", True), ("off", False)])
def test_the_thread_share_is_on_unless_switched_off(raw: str | None, on: bool) -> None:
    assert load_settings({} if raw is None else {"CHATQ_THREAD_SHARE": raw}).thread_share is on


def test_libpq_urls_are_mapped_to_psycopg3() -> None:
    assert load_settings({"DATABASE_URL": "postgresql://u@h/db"}).database_url == "postgresql+psycopg://u@h/db"


def test_passwords_are_masked() -> None:
    assert mask_url("rediss://:hunter2@cache:6380/0") == "rediss://:***@cache:6380/0"
    assert mask_url("redis://localhost:6379/0") == "redis://localhost:6379/0"
    line = "cannot reach redis://user:hunter2@cache:6379/0 or postgresql+psycopg://pg:pw@db/x"
    masked = mask_secrets(line)
    assert "hunter2" not in masked and ":pw@" not in masked
    assert "rediss://:***@" in mask_secrets("rediss://:hunter2@cache:6380/0")


def test_configured_secret_values_are_masked_wherever_they_appear() -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-live-0123456789abcdef",
        "CHATQ_API_TOKEN": "gateway-token-one-0123456789,gateway-token-two-0123456789",
        "FLOWER_BASIC_AUTH": "admin:flower-pass-1,ops:flower-pass-2",
        "DATABASE_URL": "postgresql+psycopg://chatq:db%40pass@db:5432/chatq",
        "REDIS_URL": "redis://:redis-pass@cache:6379/0",
    }
    with environ(**secrets):
        line = (
            "Error code: 401 - {'error': {'message': 'Incorrect API key provided: sk-live-0123456789abcdef'}} "
            "token gateway-token-two-0123456789 pw flower-pass-2 db db@pass redis redis-pass"
        )
        masked = mask_secrets(line)
        for secret in ("sk-live-0123456789abcdef", "gateway-token-two", "flower-pass-2", "db@pass", "redis-pass"):
            assert secret not in masked, masked
        assert "Incorrect API key provided: ***" in masked
        # Not the user names, and nothing else of the line.
        assert mask_secrets("admin logged in for chatq") == "admin logged in for chatq"
    with environ(OPENAI_API_KEY="abc"):
        assert mask_secrets("abc is too short to be masked") == "abc is too short to be masked"


def test_the_metrics_endpoint_listens_on_loopback_unless_told_otherwise() -> None:
    assert load_settings({}).metrics_port is None
    assert load_settings({"CHATQ_METRICS_PORT": "9100"}).metrics_addr == "127.0.0.1"
    assert load_settings({"CHATQ_METRICS_ADDR": "0.0.0.0"}).metrics_addr == "0.0.0.0"
    assert load_settings({"CHATQ_METRICS_ADDR": "[::]"}).metrics_addr == "::"

"""`chatq flower`: the command and environment it hands Flower, and when it refuses to start."""

from __future__ import annotations

import sys

import pytest

from worker.errors import ConfigError
from worker.ops.flower import flower_command

CREDENTIALS = {"FLOWER_BASIC_AUTH": "admin:s3cret-pw"}


def _option_values(command: list[str], name: str) -> list[str]:
    return [arg.partition("=")[2] for arg in command if arg.startswith(f"--{name}=")]


def test_runs_celery_flower_for_this_app_with_credentials_in_the_environment() -> None:
    command, env = flower_command(["--port=5555"], {**CREDENTIALS, "PATH": "/usr/bin"})
    # Through worker.ops.flower, which puts /metrics behind the same credentials, then `celery flower`.
    assert command[:6] == [sys.executable, "-m", "worker.ops.flower", "-A", "worker.app:app", "flower"]
    assert "--port=5555" in command
    assert env["FLOWER_BASIC_AUTH"] == "admin:s3cret-pw"
    assert env["PATH"] == "/usr/bin"
    # Credentials never go on the command line, where `ps` would show them.
    assert not any("s3cret-pw" in arg for arg in command)
    # Without auth problems, the address is Flower's own default (all interfaces).
    assert _option_values(command, "address") == []


def test_sets_chatq_defaults_unless_given() -> None:
    command, _ = flower_command([], CREDENTIALS)
    assert _option_values(command, "max_tasks") == ["10000"]
    assert len(_option_values(command, "purge_offline_workers")) == 1
    command, _ = flower_command(["--max-tasks=500"], CREDENTIALS)
    assert _option_values(command, "max_tasks") == []
    assert "--max-tasks=500" in command
    command, _ = flower_command([], {**CREDENTIALS, "FLOWER_MAX_TASKS": "42"})
    assert _option_values(command, "max_tasks") == []


def test_no_credentials_is_refused() -> None:
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
        flower_command(["--port=5555"], {})
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
        flower_command([], {"FLOWER_BASIC_AUTH": "  "})


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.168.1.10", ""])
def test_unauthenticated_on_a_public_address_is_refused(address: str) -> None:
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1"):
        flower_command(["--unauthenticated", f"--address={address}"], {})


def test_unauthenticated_address_from_the_environment_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"not on 0\.0\.0\.0"):
        flower_command(["--unauthenticated"], {"FLOWER_ADDRESS": "0.0.0.0"})


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "localhost"])
def test_unauthenticated_on_loopback_is_allowed(address: str) -> None:
    command, env = flower_command(["--unauthenticated", f"--address={address}", "--port=5599"], {})
    assert "--unauthenticated" not in command  # our flag; Flower would reject it
    assert _option_values(command, "address")[-1] == address
    assert "--port=5599" in command
    assert "FLOWER_BASIC_AUTH" not in env


def test_unauthenticated_without_an_address_binds_to_loopback() -> None:
    # Flower's default address is every interface; an open Flower must not get it.
    command, env = flower_command(["--unauthenticated"], {"FLOWER_BASIC_AUTH": ""})
    assert _option_values(command, "address") == ["127.0.0.1"]
    assert "FLOWER_BASIC_AUTH" not in env  # an empty value would lock everyone out, not open Flower


def test_unauthenticated_on_a_unix_socket_is_refused() -> None:
    # Flower creates its unix socket with mode 0777.
    with pytest.raises(ConfigError, match="unix socket"):
        flower_command(["--unauthenticated", "--unix_socket=/tmp/flower.sock"], {})


@pytest.mark.parametrize("value", ["admin", "admin:", ":pw", "admin:pw,bob", "admin:pw,,bob:pw2"])
def test_malformed_basic_auth_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError, match="user:password") as raised:
        flower_command([], {"FLOWER_BASIC_AUTH": value})
    if value not in ("admin", "admin:"):
        assert "pw" not in raised.value.message


def test_several_users_and_stray_spaces() -> None:
    _, env = flower_command([], {"FLOWER_BASIC_AUTH": "admin:pw1, ops:pw2 "})
    # Flower compares entries byte for byte, so a space after a comma would make that login fail.
    assert env["FLOWER_BASIC_AUTH"] == "admin:pw1,ops:pw2"


def test_basic_auth_on_the_command_line_moves_to_the_environment() -> None:
    command, env = flower_command(["--basic-auth=cli:from-args", "--port=5555"], {"FLOWER_BASIC_AUTH": "env:pw"})
    assert env["FLOWER_BASIC_AUTH"] == "cli:from-args"  # the command line wins, as in Flower
    assert not any("from-args" in arg or "basic" in arg for arg in command)
    with pytest.raises(ConfigError, match="--basic_auth"):
        flower_command(["--basic_auth=nocolon"], {})


def test_oauth_counts_as_authentication() -> None:
    command, env = flower_command(
        ["--auth=.*@example\\.com", "--auth_provider=flower.views.auth.GithubLoginHandler"], {}
    )
    assert "--auth=.*@example\\.com" in command
    assert _option_values(command, "address") == []
    assert "FLOWER_BASIC_AUTH" not in env


def test_split_option_values_are_refused() -> None:
    # Flower only parses --name=value; `--address 0.0.0.0` must not slip past the address check.
    with pytest.raises(ConfigError, match="--address=VALUE"):
        flower_command(["--unauthenticated", "--address", "0.0.0.0"], {})


def test_cli_error_is_one_line() -> None:
    with pytest.raises(ConfigError) as raised:
        flower_command([], {})
    assert "\n" not in raised.value.message

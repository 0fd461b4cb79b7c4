"""`chatq flower` and `chatq serve` refuse the public placeholder secrets of `.env.example`."""

from __future__ import annotations

import pytest

from worker.errors import ConfigError
from worker.gateway.command import refuse_placeholder_token
from worker.ops.flower import flower_command


@pytest.mark.parametrize(
    ("extra", "env", "where"),
    [
        ([], {"FLOWER_BASIC_AUTH": "admin:change-me-flower"}, "FLOWER_BASIC_AUTH"),
        ([], {"FLOWER_BASIC_AUTH": "ops:a-real-password,admin:change-me-flower"}, "entry 2 of FLOWER_BASIC_AUTH"),
        (["--basic_auth=admin:change-me-flower"], {}, "--basic_auth"),
    ],
)
def test_flower_refuses_the_placeholder_password(extra: list[str], env: dict[str, str], where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        flower_command(extra, env)
    message = caught.value.message
    assert message.startswith(where) and "placeholder password from .env.example" in message
    assert "change-me" not in message, "the error must not echo the secret"


def test_flower_accepts_a_real_password() -> None:
    _, env = flower_command([], {"FLOWER_BASIC_AUTH": "admin:5b1d0c7e-change-me-not-at-start"})
    assert env["FLOWER_BASIC_AUTH"] == "admin:5b1d0c7e-change-me-not-at-start"


@pytest.mark.parametrize(
    "token", ["change-me-gateway-token-0123456789", "a" * 32 + ",change-me-gateway-token-0123456789"]
)
def test_serve_refuses_the_placeholder_token(token: str) -> None:
    with pytest.raises(ConfigError, match=r"^CHATQ_API_TOKEN still holds the placeholder from \.env\.example"):
        refuse_placeholder_token({"CHATQ_API_TOKEN": token})


@pytest.mark.parametrize("env", [{}, {"CHATQ_API_TOKEN": ""}, {"CHATQ_API_TOKEN": "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c"}])
def test_serve_accepts_other_tokens(env: dict[str, str]) -> None:
    refuse_placeholder_token(env)  # no token at all is load_gateway_settings' business

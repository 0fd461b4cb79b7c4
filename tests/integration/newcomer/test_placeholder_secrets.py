"""`chatq serve` and `chatq flower` as compose runs them, with `.env.example` copied unchanged: refused in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.cli import chatq
from worker.envfile import parse_env_text

EXAMPLE = parse_env_text((Path(__file__).resolve().parents[3] / ".env.example").read_text(), source=".env.example")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chatq: error: "), stderr
    return lines[0]


@pytest.mark.slow  # a `chatq serve` subprocess
def test_serve_refuses_the_example_token(chatq_env: dict[str, str]) -> None:
    env = {**chatq_env, "CHATQ_API_TOKEN": EXAMPLE["CHATQ_API_TOKEN"]}
    # Were it accepted, this gateway would serve (on a free loopback port) until the timeout.
    result = chatq(env, "serve", "--host", "127.0.0.1", "--port", str(_free_port()), timeout=30)
    assert result.returncode == 1
    line = _one_line(result.stderr)
    assert "CHATQ_API_TOKEN still holds the placeholder from .env.example" in line
    assert EXAMPLE["CHATQ_API_TOKEN"] not in line


@pytest.mark.parametrize("how", ["environment", "option"])
def test_flower_refuses_the_example_password(chatq_env: dict[str, str], how: str) -> None:
    credentials = EXAMPLE["FLOWER_BASIC_AUTH"]
    if how == "environment":
        result = chatq({**chatq_env, "FLOWER_BASIC_AUTH": credentials}, "flower", "--port=5555")
    else:
        result = chatq({**chatq_env, "FLOWER_BASIC_AUTH": ""}, "flower", f"--basic_auth={credentials}")
    assert result.returncode == 1
    line = _one_line(result.stderr)
    assert "still holds the placeholder password from .env.example" in line
    assert credentials.partition(":")[2] not in line

"""chatq/shortcuts/: each shortcut is taken on the installed library versions, and a gate that finds
a problem selects the public API and says so once."""

from __future__ import annotations

import logging

import pytest

from chatq.shortcuts import Gate, kombu_channel, minor_version, openai_client, redis_resp


@pytest.mark.parametrize("module", [kombu_channel, redis_resp, openai_client], ids=lambda m: m.__name__)
def test_every_shortcut_is_taken_on_the_pinned_versions(module: object) -> None:
    # If this fails after an upgrade, the shortcut silently became the slower public path:
    # re-measure and re-test it against the new version (BENCHMARKS.md) before widening its range.
    assert module._problem() is None  # type: ignore[attr-defined]
    assert module.GATE.usable()  # type: ignore[attr-defined]


def test_a_gate_with_a_problem_says_so_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    checks: list[int] = []

    def problem() -> str:
        checks.append(1)
        return "the library has no _hook"

    gate = Gate("example", problem)
    with caplog.at_level(logging.INFO, logger="chatq.shortcuts"):
        assert not gate.usable()
        assert not gate.usable()
    assert checks == [1]
    messages = [r.getMessage() for r in caplog.records if r.name == "chatq.shortcuts"]
    assert messages == ["shortcut example not taken, using the public API: the library has no _hook"]
    assert caplog.records[0].levelno == logging.INFO


def test_a_gate_without_a_problem_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="chatq.shortcuts"):
        assert Gate("example", lambda: None).usable()
    assert caplog.records == []


@pytest.mark.parametrize(
    ("version", "expected"),
    [("5.7.0", (5, 7)), ("3.57.0rc1", (3, 57)), ("8.1", (8, 1)), ("9", (0, 0)), ("x.y", (0, 0))],
)
def test_minor_version(version: str, expected: tuple[int, int]) -> None:
    assert minor_version(version) == expected

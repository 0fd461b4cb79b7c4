"""`make test` is long (minutes, tens of them on a busy machine): it must never look like a hang.

Every pytest run of the Makefile names each test as it starts (`-v`) and lists the slowest at the
end, and the README names the quick subset, `make test-unit`.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pytest_commands(*targets: str) -> list[list[str]]:
    """The pytest command lines `make TARGETS` would run (make's dry run: nothing is executed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *targets], capture_output=True, text=True, check=True, timeout=60
    )
    return [shlex.split(line.split(" -m pytest", 1)[1]) for line in dry.stdout.splitlines() if " -m pytest" in line]


def test_every_test_target_shows_progress_per_test() -> None:
    commands = _pytest_commands("test", "test-unit", "test-integration", "test-faults")
    assert len(commands) == 5  # `make test`: two runs
    for arguments in commands:
        assert "-v" in arguments, arguments
        assert any(argument.startswith("--durations=") for argument in arguments), arguments


def test_make_test_runs_every_test_once_the_exclusive_ones_alone() -> None:
    parallel, alone = _pytest_commands("test")
    # The suite on several processes, less the tests marked exclusive ...
    assert parallel[parallel.index("-n") + 1].isdigit() and int(parallel[parallel.index("-n") + 1]) >= 2
    assert parallel[parallel.index("-m") + 1] == "not exclusive"
    # ... then those on one process, nothing else running: together, the whole suite.
    assert "-n" not in alone and alone[alone.index("-m") + 1] == "exclusive"
    assert not [argument for argument in parallel + alone if argument.startswith("tests")]


def test_the_readme_names_the_quick_subset() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert "make test-unit" in setup

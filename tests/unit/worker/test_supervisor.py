"""How `chatq worker` splits `--processes` from Celery's options and names each process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from worker.cli.supervisor import child_arguments, child_hostname, default_processes, take_processes
from worker.errors import CliError

ROOT = Path(__file__).resolve().parents[3]


def test_processes_is_taken_out_in_either_spelling() -> None:
    assert take_processes(["--processes", "3", "-Q", "chatq"]) == (3, ["-Q", "chatq"])
    assert take_processes(["-Q", "chatq", "--processes=1"]) == (1, ["-Q", "chatq"])
    assert take_processes(["--concurrency", "4"]) == (None, ["--concurrency", "4"])


@pytest.mark.parametrize(
    "arguments", [["--processes"], ["--processes", "0"], ["--processes=two"], ["--processes", "-1"]]
)
def test_a_bad_process_count_is_one_clear_error(arguments: list[str]) -> None:
    with pytest.raises(CliError, match="--processes"):
        take_processes(arguments)


def test_each_process_gets_its_own_node_name_on_the_same_host() -> None:
    assert child_hostname("w1@%h", 2) == "w1-2@%h"
    assert child_hostname("plain", 1) == "plain-1"
    assert child_arguments(["--hostname", "a@box", "-c", "2"], 1) == ["--hostname", "a-1@box", "-c", "2"]
    assert child_arguments(["-n", "a@box"], 3) == ["-n", "a-3@box"]
    assert child_arguments(["--hostname=a@box"], 2) == ["--hostname=a-2@box"]
    assert child_arguments(["-c", "2"], 2) == ["-c", "2", "--hostname", "celery-2@%h"]


def test_the_default_is_the_cores_this_process_may_use() -> None:
    assert default_processes() >= 1


# The supervisor itself, on plain Python children (no Celery): it installs signal handlers, so it
# runs in a process of its own, as `chatq worker` does.
SUPERVISE = """
import sys
from worker.cli.supervisor import Supervisor
child = [sys.executable, "-c", sys.argv[1]]
sys.exit(Supervisor(commands=[child, child]).run())
"""
SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("child got SIGTERM", flush=True), sys.exit(0)))
print("child up", flush=True)
time.sleep(60)
"""


def _supervise(child: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SUPERVISE, child],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_sigterm_reaches_every_child_and_the_service_exits_0() -> None:
    service = _supervise(SLEEPER)
    assert service.stdout is not None
    lines: list[str] = []
    while lines.count("child up\n") < 2:
        line = service.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    service.send_signal(signal.SIGTERM)
    output, _ = service.communicate(timeout=30)
    assert service.returncode == 0, "".join(lines) + output
    assert output.count("child got SIGTERM") == 2


def test_a_child_that_rejects_its_options_stops_the_service_with_its_status() -> None:
    service = _supervise("import sys; sys.exit(64)")
    output, _ = service.communicate(timeout=30)
    assert service.returncode == 64, output
    assert "rejected its options (exit 64); stopping" in output

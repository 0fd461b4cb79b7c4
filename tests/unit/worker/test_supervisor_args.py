"""How `chatq worker` splits `--processes` from Celery's options and names each process."""

from __future__ import annotations

import pytest

from worker.cli.supervisor import child_arguments, child_hostname, default_processes, take_processes
from worker.errors import CliError


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

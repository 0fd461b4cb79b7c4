"""Node names a `chatq worker` service holds on this host while it runs (worker/cli/node_names.py)."""

from __future__ import annotations

import socket
import sys

import pytest

from worker.cli.node_names import _kept, claim_node_names, hold_for_exec, node_name
from worker.errors import CliError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names are held on Linux only")


def test_node_names_are_celerys_with_the_host_expanded() -> None:
    host = socket.gethostname()
    assert node_name(["--hostname", "w@%h"], 2) == f"w-2@{host}"
    assert node_name(["-c", "1"], 1) == f"celery-1@{host}"
    assert node_name(["--hostname=w@box"], 3) == "w-3@box"
    assert node_name(["-n", "plain"], 1) == "celery@plain-1"  # as Celery reads a name without "@"


def test_a_second_service_takes_the_next_free_names_until_the_first_releases_them() -> None:
    arguments = ["--hostname", "unit-names@%h"]
    first = claim_node_names(arguments, 2)
    try:
        assert first.indexes == [1, 2] and not first.taken
        second = claim_node_names(arguments, 2)
        try:
            assert second.indexes == [3, 4]
            assert second.taken == first.names
            assert set(second.names).isdisjoint(first.names)
        finally:
            second.release()
        other = claim_node_names(["--hostname", "unit-other@%h"], 1)
        other.release()
        assert other.indexes == [1]  # another name is not held by the first service
    finally:
        first.release()
    again = claim_node_names(arguments, 2)
    again.release()
    assert again.indexes == [1, 2]


def test_a_single_worker_holds_its_name_and_a_second_under_it_is_refused() -> None:
    held = claim_node_names(["--hostname", "unit-single@%h"], 1)
    try:
        # The supervised service's first name is `unit-single-1@host`; a single worker's is its own.
        hold_for_exec(["--hostname", "unit-single@%h"])
        with pytest.raises(CliError, match=f"unit-single@{socket.gethostname()} already runs on this host"):
            hold_for_exec(["--hostname", "unit-single@%h"])
    finally:
        held.release()
        for sock in _kept:
            sock.close()
        _kept.clear()

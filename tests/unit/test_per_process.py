"""`chatq.per_process`: one value per process, built on first use, rebuilt in a forked child."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

from chatq.per_process import PerProcess


def _counter() -> tuple[PerProcess[dict[str, int]], list[str]]:
    log: list[str] = []
    built = iter(range(100))

    def build() -> dict[str, int]:
        log.append("build")
        return {"n": next(built)}

    value: PerProcess[dict[str, int]] = PerProcess(
        build, close=lambda v: log.append(f"close {v['n']}"), inherited=lambda v: log.append(f"inherit {v['n']}")
    )
    return value, log


def test_built_once_on_first_use_then_kept() -> None:
    value, log = _counter()
    assert value.built() is None and log == []
    first = value.get()
    assert value.get() is first and value.built() is first
    assert log == ["build"]


def test_threads_racing_for_the_first_use_share_one_value() -> None:
    value, log = _counter()
    start = threading.Barrier(8)
    seen: list[dict[str, int]] = []

    def use() -> None:
        start.wait()
        seen.append(value.get())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert log == ["build"] and all(v is seen[0] for v in seen)


def test_reset_closes_and_the_next_use_builds_again() -> None:
    value, log = _counter()
    value.get()
    value.reset()
    assert value.built() is None
    assert value.get()["n"] == 1
    assert log == ["build", "close 0", "build"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_builds_its_own_and_releases_the_parents() -> None:
    value, log = _counter()
    parent = value.get()
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns on fork() with threads running (pytest's, earlier tests'); the child
        # here only reads the value and exits, which is what the warning's deadlock cannot reach.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report what it saw, then leave without running the parent's cleanup
        try:
            child = value.get()
            ok = (
                value.built() is child
                and child is not parent
                and child["n"] == 1
                and log[-2:] == ["inherit 0", "build"]
            )
            os.write(write, b"ok" if ok else repr((child, log)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        answer = reader.read()
    os.waitpid(pid, 0)
    assert answer == b"ok"
    assert value.get() is parent and log == ["build"]

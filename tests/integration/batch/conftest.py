"""Two real workers for the batch tests (stopped after the package), and a model stub that can hold replies."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.openai_stub import OpenAIStub, Reply, Script
from tests.support.workers import WorkerProcess


class HoldingStub(OpenAIStub):
    """The model stub plus one directive, `[hold: KEY]`: the reply waits until the test calls `release(KEY)`.

    A test can then interrupt a batch at a point it knows: the held turns are provably still running.
    """

    def __init__(self) -> None:
        super().__init__()
        self._gates: dict[str, threading.Event] = {}
        self._waiting: Counter[str] = Counter()
        self._gate_lock = threading.Lock()

    def _gate(self, key: str) -> threading.Event:
        with self._gate_lock:
            return self._gates.setdefault(key, threading.Event())

    def waiting(self, key: str) -> int:
        """Requests held on `key` right now."""
        with self._gate_lock:
            return self._waiting[key]

    def release(self, key: str) -> None:
        """Answer the requests held on `key`, and later ones at once."""
        self._gate(key).set()

    def reply_for(self, messages: list[dict[str, Any]], script: Script) -> Reply:
        key = script.directives.get("hold")
        if key:
            gate = self._gate(key)
            with self._gate_lock:
                self._waiting[key] += 1
            try:
                while not gate.wait(0.1) and not self._stopping.is_set():
                    pass
            finally:
                with self._gate_lock:
                    self._waiting[key] -= 1
        return super().reply_for(messages, script)


@pytest.fixture(scope="package")
def batch_stub() -> Iterator[HoldingStub]:
    with HoldingStub() as stub:
        yield stub


@pytest.fixture(scope="package")
def batch_env(chatq_env: dict[str, str], batch_stub: HoldingStub) -> dict[str, str]:
    return {**chatq_env, "OPENAI_BASE_URL": batch_stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


@pytest.fixture(scope="package")
def two_workers(batch_env: dict[str, str]) -> Iterator[list[WorkerProcess]]:
    # A held reply may wait longer than the tests' usual 20 s turn timeout on a busy machine.
    env = {**batch_env, "CHATQ_TURN_TIMEOUT": "120"}
    workers = [WorkerProcess(env, concurrency=8).start() for _ in range(2)]
    yield workers
    for worker in workers:
        worker.stop()

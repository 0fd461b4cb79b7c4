"""The threads variants' figures (bench/fairness.py): shares, Jain's index and the threads used."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from bench.fairness import THREADS, _thread_figures, thread_blocks


@dataclass(frozen=True)
class _Status:
    value: str


@dataclass(frozen=True)
class _Row:
    id: uuid.UUID
    status: _Status
    finished_at: datetime | None


def test_the_threads_figures_split_the_window_by_weight_and_count_the_threads_used() -> None:
    joined = 1000.0
    rows, tenant_of, starts = [], {}, {}
    # Over 10 s after b and c joined: a 40 turns, b 40, c 80 (their 1:1:2 weights), each 0.5 s long.
    for tenant, count in (("a", 40), ("b", 40), ("c", 80)):
        for i in range(count):
            turn_id = uuid.uuid4()
            end = joined + (i + 1) * 10.0 / count
            rows.append(_Row(turn_id, _Status("succeeded"), datetime.fromtimestamp(end, UTC)))
            tenant_of[turn_id] = tenant
            starts[turn_id] = end - 0.5
    figures = _thread_figures("threads", rows, tenant_of, starts, joined=joined, a_turns=40, bc_turns=40)
    assert figures["share_vs_weighted"] == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0}, rel=0.05)
    assert figures["jain"] == pytest.approx(1.0, abs=0.01)
    assert figures["mean_turn"] == pytest.approx(0.5)
    # About 159 turns finished in the ~10 s window, each 0.5 s on one of the 16 threads: half of them busy.
    assert figures["threads_used"] == pytest.approx(159 / 10.0 * 0.5 / THREADS, rel=0.05)
    names = [block.name for block in thread_blocks(figures)]
    assert names == [
        "fairness.threads.share_b",
        "fairness.threads.share_c",
        "fairness.threads.jain",
        "fairness.threads.threads_used",
    ]

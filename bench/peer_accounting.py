"""The side-by-side's arithmetic: CPU per turn with the floor, memory peak minus idle, the load gate.

Pure functions over what bench/peer.py measured, so the accounting is unit-tested
(tests/unit/bench/test_peer_accounting.py) apart from any process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOAD_LIMIT = 1.5
"""A figure is publishable only from a run that started below this 1-minute load average."""


@dataclass(frozen=True, kw_only=True)
class CpuFigures:
    """CPU of one measured phase, per turn, every process of a side counted the same way."""

    total_ms: float
    """Servers and client together, ms of CPU per turn."""
    parts_ms: dict[str, float]
    """Per part (chatq: workers, postgres, redis, client; the peer: server, client), ms per turn."""
    own_ms: float
    """`total_ms` less the floor: what the side adds to running the graph in-process."""
    cores_busy: float
    """Total CPU over the phase's wall time: how many cores the side kept busy on average."""
    turns_per_s: float
    """Turns over the phase's wall time (first submit -> last reply)."""
    turns_per_s_per_process: float
    """`turns_per_s` over the processes that run turns (chatq's workers, the peer's server)."""


def cpu_figures(
    *, parts_s: Mapping[str, float], count: int, span_s: float, floor_ms: float, serving_processes: int
) -> CpuFigures:
    """Per-turn figures from CPU seconds per part over a phase of `count` turns lasting `span_s`."""
    total_s = sum(parts_s.values())
    total_ms = 1000 * total_s / count
    turns_per_s = count / span_s if span_s > 0 else math.nan
    return CpuFigures(
        total_ms=total_ms,
        parts_ms={name: 1000 * seconds / count for name, seconds in parts_s.items()},
        own_ms=total_ms - floor_ms,
        cores_busy=total_s / span_s if span_s > 0 else math.nan,
        turns_per_s=turns_per_s,
        turns_per_s_per_process=turns_per_s / max(serving_processes, 1),
    )


@dataclass(frozen=True, kw_only=True)
class MemoryFigures:
    """Memory of every process of a side around a burst, MiB."""

    idle_mib: float
    """Before the burst, after start-up and warm-up."""
    peak_mib: float
    """The largest sample during the burst."""
    added_mib: float
    """`peak_mib - idle_mib`: what the in-flight turns took."""
    per_turn_mib: float
    """`added_mib` per turn of the burst."""


def memory_figures(*, idle_kib: float, peak_kib: float, count: int) -> MemoryFigures:
    added = (peak_kib - idle_kib) / 1024
    idle, peak = idle_kib / 1024, peak_kib / 1024
    return MemoryFigures(idle_mib=idle, peak_mib=peak, added_mib=added, per_turn_mib=added / count)


def publishable(load: float) -> bool:
    return load < LOAD_LIMIT


def load_verdict(loads: Sequence[float]) -> str:
    """'' when every run behind a figure started below the limit, else `NOT PUBLISHABLE (load X)` (the highest)."""
    if not loads:
        return "NOT PUBLISHABLE (no load recorded)"
    worst = max(loads)
    return "" if publishable(worst) else f"NOT PUBLISHABLE (load {worst:.2f})"


def load_note(loads: Sequence[float]) -> str:
    """The loads the runs behind a figure started at, and whether it may be published."""
    listed = ", ".join(f"{load:.2f}" for load in loads)
    return f"{listed} at start -> {load_verdict(loads) or 'publishable'}"


def with_floor(figure_ms: float, floor_ms: float) -> str:
    """A CPU figure beside the floor: `42.8 ms (floor 11.4, own 31.4)`; the figure alone when no floor was measured."""
    if math.isnan(floor_ms):
        return f"{figure_ms:.1f} ms"
    return f"{figure_ms:.1f} ms (floor {floor_ms:.1f}, own {figure_ms - floor_ms:.1f})"

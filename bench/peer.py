"""chatq beside LangGraph's own server (`langgraph dev`, in-memory runtime), alternating, same run.

`make bench-peer` installs the peer into a venv of its own (.local/peer-venv, pyproject's `peer`
extra) and runs `python -m bench peer`. Both sides run the same agent graph (bench/peer_graph.py is
chatq's nodes and edges) on the same model client against one stub process (bench/stub.py); the
order of the sides flips every round. chatq is plain `chatq worker` as users run it (no options:
a process per core, gossip, mingle and the sweep on); the peer is `langgraph dev
--n-jobs-per-worker 200`, offline (bench/peer_sides.py says how).

The accounting (issue 32), the same on both sides:
- **A fresh side for every figure**: each figure below starts its side, warms it with 8 turns,
  measures, stops it (the peer's in-memory runtime never holds an earlier figure's runs).
- **Every process, clients included**: CPU per turn is the side's process trees (chatq: the
  workers, Postgres's postmaster tree, Redis; the peer: the server's tree) plus the client, which
  runs in a process of its own for both sides (bench/peer_client.py) and reports its CPU from the
  first submit to the last reply. Per part, per turn, and the cores the side kept busy.
- **The floor**: the same graph in-process, no queue (bench/peer_floor.py), measured every round
  and printed beside every CPU figure with each side's own cost (figure - floor).
- **Processes said**: how many each side ran, throughput per serving process beside the total.
- **Memory of every process** (PSS: chatq's workers + Postgres + Redis; the peer's server tree):
  idle after warm-up, peak during the first burst, peak - idle and per turn.
- **Dispatch idle and busy**: submit -> model request for turns one at a time, once with nothing
  else running (the peer's queue then polls every 0.5 s) and once beside turns kept in flight.
- **Load**: each figure's run starts after waiting (up to `settle_s`) for the 1-minute load to
  drop below 1.5; the load is printed beside every figure and a figure any of whose runs started
  at or above it is marked `NOT PUBLISHABLE (load X)` instead of a verdict.

Figures: `N@Ss` (N turns at once, model answering after S s: first submit -> last reply against
the ideal S), `throughput` and `cpu_per_turn` (the saturation run: many turns, instant model;
chatq also from raw task messages, another language's producer), `dispatch_idle_p50`,
`dispatch_busy_p50`, `stream_p50` (the stub streaming 20 chunks 10 ms apart, each carrying its
send time; chatq: pub/sub, the peer: its SSE stream; beside raw Redis pub/sub), `memory_per_turn`.
`--quick` is one round at full size; with CHATQ_BENCH_PEER_SMOKE=1 as well, every count is the
smallest that runs each path (a smoke run: no figure of it means anything).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.common import Block, Sampler, Stub, isolated_services, log, percentile, use_stub
from bench.peer_accounting import cpu_figures, memory_figures, with_floor
from bench.peer_client import run_client
from bench.peer_procs import tree_cpu, tree_memory_kib
from bench.peer_sides import PEER_VENV, Chatq, Peer, Side

STREAM_CHUNKS, STREAM_INTERVAL = 20, 0.01


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How much of everything one run does."""

    at_once: int
    """Turns submitted at once in the burst figures (and the peer's job limit)."""
    latencies: tuple[float, ...]
    """Model latencies of the burst figures, s; the first one's burst gives the memory figure."""
    saturation: int
    """Turns of the saturation run (instant model)."""
    stream_turns: int
    """Turns one at a time per stream run (idle, busy)."""
    busy_in_flight: int
    """Turns kept in flight beside the busy stream run."""
    rounds: int
    """Alternating rounds (medians are reported)."""
    settle_s: float
    """How long a figure waits for the load to drop below the limit before its run starts."""


FULL = Plan(
    at_once=200, latencies=(10.0, 2.0), saturation=1000, stream_turns=20, busy_in_flight=20, rounds=3, settle_s=180
)
QUICK = Plan(
    at_once=200, latencies=(10.0, 2.0), saturation=300, stream_turns=20, busy_in_flight=20, rounds=1, settle_s=60
)
SMOKE = Plan(at_once=4, latencies=(1.0,), saturation=6, stream_turns=2, busy_in_flight=2, rounds=1, settle_s=0)
LIMITS = {10.0: 1.1, 2.0: 1.6}
"""Issue 32's targets for chatq's N at once: x ideal."""


def plan_for(quick: bool, environ: dict[str, str] | os._Environ[str] = os.environ) -> Plan:
    if quick and environ.get("CHATQ_BENCH_PEER_SMOKE") == "1":
        return SMOKE
    return QUICK if quick else FULL


def settle(seconds: float) -> float:
    """Wait up to `seconds` for the 1-minute load to drop below the limit; the load the run starts at."""
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] >= 1.5 and time.monotonic() < deadline:
        time.sleep(2)
    return os.getloadavg()[0]


# --- measurements ---------------------------------------------------------------------------------


def _phase(side: Side, plan: Plan, count: int, latency: float, floor_ms: float, *, raw: bool = False) -> dict[str, Any]:
    """One measured burst through the client process: span, CPU by part, memory, load."""
    load = settle(plan.settle_s)
    roots = side.parts()
    idle_parts = {name: float(tree_memory_kib([pid])) for name, pid in roots.items()}
    idle = sum(idle_parts.values())

    def sample() -> dict[str, float]:
        # The total and each part: a part's peak - idle says which processes grow with turns in flight.
        mem = {f"mem:{name}": float(tree_memory_kib([pid])) for name, pid in roots.items()}
        return {"mem": sum(mem.values()), **mem}

    sampler = Sampler(sample, 0.5)
    before: dict[str, float] = {}
    after: dict[str, float] = {}

    def start() -> None:
        before.update({name: tree_cpu([pid]) for name, pid in roots.items()})
        sampler.__enter__()

    def stop() -> None:
        after.update({name: tree_cpu([pid]) for name, pid in roots.items()})
        sampler.__exit__(None, None, None)

    spec = {**side.spec(), "count": count, "latency": latency, "raw": raw, "timeout": latency * 6 + 300}
    result = run_client(spec, before=start, after=stop)
    parts = {name: after[name] - before[name] for name in roots} | {"client": float(result["cpu_s"])}
    span = float(result["last_reply"]) - float(result["first_submit"])
    cpu = cpu_figures(parts_s=parts, count=count, span_s=span, floor_ms=floor_ms, serving_processes=side.serving())
    memory = memory_figures(idle_kib=idle, peak_kib=max(sampler.peak("mem"), idle), count=count)
    out = {"span": span, "ok": result["ok"], "submit_s": result["submit_s"], "load": load, "cpu": cpu}
    grown = {name: (max(sampler.peak(f"mem:{name}"), kib) - kib) / 1024 for name, kib in idle_parts.items()}
    out |= {"memory": memory, "memory_grown_mib": grown, "processes": side.describe()}
    log(
        f"{side.name}{' raw' if raw else ''}: {count} turns @ {latency:g} s: span {span:.2f} s, ok {result['ok']}, "
        f"CPU {with_floor(cpu.total_ms, floor_ms)} "
        f"[{', '.join(f'{k} {v:.1f}' for k, v in cpu.parts_ms.items())}], {cpu.cores_busy:.2f} cores busy, "
        f"memory idle {memory.idle_mib:.0f} peak {memory.peak_mib:.0f} MiB "
        f"[{', '.join(f'{k} +{v:.0f}' for k, v in grown.items())}], load {load:.2f}"
    )
    return out


def _stream(side: Side, plan: Plan, *, busy: bool) -> dict[str, float]:
    load = settle(plan.settle_s)
    dispatch, stream = [], []
    context = side.busy(plan.busy_in_flight, 1.0) if busy else contextlib.nullcontext()
    with context:
        for i in range(plan.stream_turns):
            submitted, chunks = side.streamed(f"[stamps: {STREAM_CHUNKS}] [slow: {STREAM_INTERVAL}] stream {i}")
            if chunks:
                dispatch.append(1000 * (chunks[0][0] - submitted))
                stream += [1000 * (received - stamp) for stamp, received in chunks]
            time.sleep(0.2)  # idle: the next turn meets an idle system
    out = {"dispatch_p50": percentile(dispatch, 50), "stream_p50": percentile(stream, 50)}
    out |= {"stream_p99": percentile(stream, 99), "load": load}
    log(f"{side.name} stream ({'busy' if busy else 'idle'}): {out}")
    return out


def _fresh(side: Side, measure: Any) -> Any:
    """`measure(side)` on a side started for it alone."""
    side.start()
    try:
        return measure(side)
    finally:
        side.stop()


def measure(side: Side, plan: Plan, floor_ms: float, *, raw: bool = True, stream: bool = True) -> dict[str, Any]:
    """Every figure of one side in one round, each on a side started for it."""
    out: dict[str, Any] = {"floor_ms": floor_ms}
    for latency in plan.latencies:
        log(f"{side.name}: {plan.at_once} turns at once, model after {latency:g} s (fresh side)")
        out[f"burst{latency:g}"] = _fresh(side, lambda s, la=latency: _phase(s, plan, plan.at_once, la, floor_ms))
    log(f"{side.name}: {plan.saturation} turns, instant model (fresh side)")
    out["saturation"] = _fresh(side, lambda s: _phase(s, plan, plan.saturation, 0.0, floor_ms))
    if raw and isinstance(side, Chatq):
        out["raw"] = _fresh(side, lambda s: _phase(s, plan, plan.saturation, 0.0, floor_ms, raw=True))
        last = plan.latencies[-1]
        out["raw_burst"] = _fresh(side, lambda s: _phase(s, plan, plan.at_once, last, floor_ms, raw=True))
    if stream:
        out["stream_idle"] = _fresh(side, lambda s: _stream(s, plan, busy=False))
        out["stream_busy"] = _fresh(side, lambda s: _stream(s, plan, busy=True))
    return out


def _floor(plan: Plan) -> float:
    import json
    import subprocess
    import sys

    settle(plan.settle_s)
    line = subprocess.run(
        [sys.executable, "-m", "bench.peer_floor", str(plan.saturation)], check=True, capture_output=True, text=True
    ).stdout.strip()
    floor = float(json.loads(line.splitlines()[-1])["cpu_ms"])
    log(f"floor: the graph in-process, no queue: {floor:.1f} ms of CPU per turn")
    return floor


def _raw_pubsub(plan: Plan) -> float:
    from bench.stream_latency import _raw_baseline

    return percentile(_raw_baseline(plan.stream_turns * STREAM_CHUNKS, STREAM_INTERVAL), 50)


def run(quick: bool = False) -> list[Block]:
    if not (PEER_VENV / "bin" / "langgraph").exists():
        raise RuntimeError("the peer is not installed: run `make bench-peer` (it installs .local/peer-venv)")
    plan = plan_for(quick)
    results: dict[str, list[dict[str, Any]]] = {"chatq": [], "langgraph": []}
    with isolated_services("peer") as services, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        peer = Peer(stub, jobs=plan.at_once)
        sides: list[Side] = [Chatq(stub, services), peer]
        for round_ in range(plan.rounds):
            floor = _floor(plan)
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                log(f"round {round_ + 1}/{plan.rounds}: {side.name}")
                results[side.name].append(measure(side, plan, floor))
        raw_p50 = _raw_pubsub(plan)
    log(f"peer: {len(peer.outbound)} outbound HTTP requests logged {peer.outbound[:5]}")
    from bench.peer_report import blocks

    return blocks(results, raw_p50, plan)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")

"""The side-by-side's result blocks (bench/peer.py measures; this says what it measured).

Every block carries the loads its runs started at and is withheld (`NOT PUBLISHABLE (load X)`)
when any started at or above the limit; every CPU figure stands beside the floor.
"""

from __future__ import annotations

from typing import Any

from bench.common import Block
from bench.peer import LIMITS, Plan, med
from bench.peer_accounting import CpuFigures, load_note, load_verdict, with_floor

Rounds = list[dict[str, Any]]


def _loads(rounds: Rounds, key: str) -> list[float]:
    return [float(r[key]["load"]) for r in rounds if key in r]


def _gate(c: Rounds, p: Rounds, *keys: str) -> tuple[str, dict[str, str]]:
    loads_c = [load for key in keys for load in _loads(c, key)]
    loads_p = [load for key in keys for load in _loads(p, key)]
    note = {"load": f"chatq {load_note(loads_c)}; peer {load_note(loads_p)}"}
    return load_verdict(loads_c + loads_p), note


def _cpu(rounds: Rounds, key: str) -> list[CpuFigures]:
    return [r[key]["cpu"] for r in rounds if key in r]


def _list(values: list[float], fmt: str = "{:.3g}") -> str:
    return ", ".join(fmt.format(v) for v in values)


def blocks(results: dict[str, Rounds], raw_p50: float, plan: Plan) -> list[Block]:
    c, p = results["chatq"], results["langgraph"]
    floor = med([r["floor_ms"] for r in c])
    rounds = f"medians of {plan.rounds} alternating round(s), a fresh side per figure"
    processes = {"processes": f"{c[-1]['saturation']['processes']}; {p[-1]['saturation']['processes']}"}
    out = [_burst(c, p, plan, latency) for latency in plan.latencies]

    cc, pc = _cpu(c, "saturation"), _cpu(p, "saturation")
    withheld, load = _gate(c, p, "saturation")
    out.append(
        Block(
            name="peer.throughput",
            target=f"turns/s, {plan.saturation} turns, instant model (reported beside the processes each side ran)",
            figure=med([f.turns_per_s for f in cc]),
            baseline=med([f.turns_per_s for f in pc]),
            baseline_label=f"LangGraph server; {rounds}",
            unit="turns/s",
            limit=None,
            withheld=withheld,
            details={
                "chatq": f"{_list([f.turns_per_s for f in cc])} turns/s; per worker process "
                f"{_list([f.turns_per_s_per_process for f in cc])}; cores busy {_list([f.cores_busy for f in cc])}",
                "peer": f"{_list([f.turns_per_s for f in pc])} turns/s; per server process "
                f"{_list([f.turns_per_s_per_process for f in pc])}; cores busy {_list([f.cores_busy for f in pc])}",
                "raw msgs": f"chatq from raw task messages: {_list([f.turns_per_s for f in _cpu(c, 'raw')])} turns/s",
                **processes,
                **load,
            },
        )
    )
    chatq_ms, peer_ms = med([f.total_ms for f in cc]), med([f.total_ms for f in pc])
    raw_ms = med([f.total_ms for f in _cpu(c, "raw")])
    withheld, load = _gate(c, p, "saturation", "raw")
    out.append(
        Block(
            name="peer.cpu_per_turn",
            target="CPU per turn, every process incl. the client: chatq <= 0.5x the peer's and <= floor + 12 ms",
            figure=chatq_ms,
            baseline=peer_ms,
            baseline_label=f"LangGraph server + its client; {rounds}",
            unit="ms",
            limit=0.5,
            withheld=withheld,
            details={
                "floor": f"the graph in-process, no queue: {_list([r['floor_ms'] for r in c], '{:.1f}')} ms",
                "chatq": f"{with_floor(chatq_ms, floor)}; floor + 12 {'met' if chatq_ms <= floor + 12 else 'missed'}",
                "peer": with_floor(peer_ms, floor),
                "split": "ms per turn: chatq "
                + "; ".join(_parts(f) for f in cc)
                + " | peer "
                + "; ".join(_parts(f) for f in pc),
                "raw msgs": f"chatq from raw task messages: {with_floor(raw_ms, floor)} "
                f"(rounds {_list([f.total_ms for f in _cpu(c, 'raw')])})",
                **processes,
                **load,
            },
        )
    )
    for mode, what in (("idle", "nothing else running"), ("busy", f"{plan.busy_in_flight} turns kept in flight")):
        key = f"stream_{mode}"
        withheld, load = _gate(c, p, key)
        dc, dp = [r[key]["dispatch_p50"] for r in c], [r[key]["dispatch_p50"] for r in p]
        out.append(
            Block(
                name=f"peer.dispatch_{mode}_p50",
                target=f"submit -> model request p50, one turn at a time, {what}: chatq ahead of the peer",
                figure=med(dc),
                baseline=med(dp),
                baseline_label=f"LangGraph server; {rounds}",
                unit="ms",
                limit=1.0,
                withheld=withheld,
                details={"chatq": _list(dc), "peer": _list(dp), **load},
            )
        )
    withheld, load = _gate(c, p, "stream_idle")
    sc = med([r["stream_idle"]["stream_p50"] for r in c])
    out.append(
        Block(
            name="peer.stream_p50",
            target="token -> subscriber p50: chatq <= 1.5x raw Redis pub/sub, p99 <= 3 ms",
            figure=sc,
            baseline=med([r["stream_idle"]["stream_p50"] for r in p]),
            baseline_label=f"LangGraph server's SSE stream; {rounds}",
            unit="ms",
            limit=None,
            withheld=withheld,
            details={
                "p99": f"chatq {med([r['stream_idle']['stream_p99'] for r in c]):.2f} ms, "
                f"peer {med([r['stream_idle']['stream_p99'] for r in p]):.2f} ms",
                "raw": f"raw Redis pub/sub p50 {raw_p50:.2f} ms: chatq {sc / raw_p50:.2f}x",
                **load,
            },
        )
    )
    out.append(_memory(c, p, plan))
    return out


def _parts(figures: CpuFigures) -> str:
    return "/".join(f"{name} {ms:.1f}" for name, ms in figures.parts_ms.items())


def _burst(c: Rounds, p: Rounds, plan: Plan, latency: float) -> Block:
    key = f"burst{latency:g}"
    spans_c, spans_p = [r[key]["span"] for r in c], [r[key]["span"] for r in p]
    chatq_x, peer_x = med(spans_c) / latency, med(spans_p) / latency
    withheld, load = _gate(c, p, key, *(["raw_burst"] if latency == plan.latencies[-1] else []))
    details = {
        "chatq": f"{chatq_x:.3f}x ideal (rounds: {_list(spans_c)} s; ok {_list([r[key]['ok'] for r in c])}; "
        f"its client submitted in {_list([r[key]['submit_s'] for r in c])} s)",
        "peer": f"{peer_x:.3f}x ideal (rounds: {_list(spans_p)} s; ok {_list([r[key]['ok'] for r in p])})",
        "ratio": f"chatq/peer {chatq_x / peer_x:.3f}",
        **load,
    }
    if latency == plan.latencies[-1]:
        details["raw msgs"] = f"chatq, raw task messages: {med([r['raw_burst']['span'] for r in c]) / latency:.3f}x"
    return Block(
        name=f"peer.{plan.at_once}@{latency:g}s",
        target=f"{plan.at_once} turns at once, model at {latency:g} s: chatq's last reply <= "
        f"{LIMITS.get(latency, 1.6)}x ideal",
        figure=med(spans_c),
        baseline=latency,
        baseline_label="ideal: the model latency",
        unit="s",
        limit=LIMITS.get(latency, 1.6),
        withheld=withheld,
        details=details,
    )


def _memory(c: Rounds, p: Rounds, plan: Plan) -> Block:
    key = f"burst{plan.latencies[0]:g}"
    withheld, load = _gate(c, p, key)

    def said(rounds: Rounds) -> str:
        m = [r[key]["memory"] for r in rounds]
        return (
            f"idle {med([x.idle_mib for x in m]):.0f} MiB, peak {med([x.peak_mib for x in m]):.0f} MiB, "
            f"peak - idle {med([x.added_mib for x in m]):.0f} MiB ({rounds[-1][key]['processes']})"
        )

    return Block(
        name="peer.memory_per_turn",
        target=f"(peak - idle) PSS of every process per in-flight turn, {plan.at_once} at {plan.latencies[0]:g} s: "
        "chatq (workers + Postgres + Redis) <= the peer (server tree)",
        figure=med([r[key]["memory"].per_turn_mib for r in c]),
        baseline=med([r[key]["memory"].per_turn_mib for r in p]),
        baseline_label="LangGraph server",
        unit="MiB",
        limit=1.0,
        withheld=withheld,
        details={"chatq": said(c), "peer": said(p), **load},
    )

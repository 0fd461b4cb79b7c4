"""Why `chatq worker` runs a process per core: the default beside one process with as many threads.

`python -m bench processes`: plain `chatq worker` (one process per core, CHATQ_WORKER_CONCURRENCY
threads each) and `chatq worker --processes 1 --concurrency 256` (the same 256 turns at once in one
interpreter, what `chatq worker` was before), in alternating rounds on one stub and one database,
measured as bench/peer.py measures chatq (a fresh worker per figure, every process and the client
counted): 200 turns at once at 10 s and 2 s (first submit -> last reply), and 1,000 turns with an
instant model (throughput, CPU per turn of every process).
"""

from __future__ import annotations

import math
from typing import Any

from bench.common import Block, Stub, isolated_services, log, use_stub
from bench.peer import measure, med, plan_for
from bench.peer_sides import Chatq

ONE = ("--processes", "1", "--concurrency", "256")


def _list(rounds: list[dict[str, Any]], pick: Any) -> str:
    return ", ".join(f"{pick(r):.3g}" for r in rounds)


def run(quick: bool = False) -> list[Block]:
    plan = plan_for(quick)
    rounds = 1 if quick else 2
    results: dict[str, list[dict[str, Any]]] = {"default": [], "one": []}
    with isolated_services("processes") as services, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        sides = [("default", Chatq(stub, services)), ("one", Chatq(stub, services, ONE))]
        for round_ in range(rounds):
            for key, side in sides if round_ % 2 == 0 else sides[::-1]:
                log(f"round {round_ + 1}/{rounds}: {side.name}")
                results[key].append(measure(side, plan, math.nan, raw=False, stream=False))
    d, o = results["default"], results["one"]
    blocks = []
    for latency in plan.latencies:
        key = f"burst{latency:g}"
        blocks.append(
            Block(
                name=f"processes.{plan.at_once}@{latency:g}s",
                target=f"{plan.at_once} turns at once, model at {latency:g} s: a process per core against one process",
                figure=med([r[key]["span"] for r in d]),
                baseline=med([r[key]["span"] for r in o]),
                baseline_label="one process, 256 threads",
                unit="s",
                limit=None,
                details={
                    "default": _list(d, lambda r, k=key: r[k]["span"]),
                    "one": _list(o, lambda r, k=key: r[k]["span"]),
                },
            )
        )
    blocks.append(
        Block(
            name="processes.throughput",
            target="turns/s at saturation: a process per core against one process",
            figure=med([r["saturation"]["cpu"].turns_per_s for r in d]),
            baseline=med([r["saturation"]["cpu"].turns_per_s for r in o]),
            baseline_label="one process, 256 threads",
            unit="turns/s",
            limit=None,
            higher_is_better=True,
            details={
                "default": _list(d, lambda r: r["saturation"]["cpu"].turns_per_s),
                "one": _list(o, lambda r: r["saturation"]["cpu"].turns_per_s),
                "cpu": f"ms per turn, every process and the client: default "
                f"{_list(d, lambda r: r['saturation']['cpu'].total_ms)}; "
                f"one {_list(o, lambda r: r['saturation']['cpu'].total_ms)}",
            },
        )
    )
    return blocks

"""Why `chatq worker` runs a process per core: the default beside one process with as many threads.

`python -m bench processes`: plain `chatq worker` (one process per core, CHATQ_WORKER_CONCURRENCY
threads each) and `chatq worker --processes 1 --concurrency 256` (the same 256 turns at once in one
interpreter, what `chatq worker` was before), in alternating rounds on one stub and one database,
measured as bench/peer.py measures chatq: 200 turns at once at 10 s and 2 s (first submit -> last
reply), and 1,000 turns with an instant model (throughput, CPU per turn of every process).
"""

from __future__ import annotations

from bench.common import Block, Stub, isolated_services, log, use_stub
from bench.peer import AT_ONCE, Chatq, _measure, _med, _spread

ONE = ("--processes", "1", "--concurrency", "256")


def run(quick: bool = False) -> list[Block]:
    rounds = 1 if quick else 2
    results: dict[str, list[dict[str, float]]] = {"default": [], "one": []}
    with isolated_services("processes") as services, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        sides = [("default", Chatq(stub, services)), ("one", Chatq(stub, services, ONE))]
        for round_ in range(rounds):
            for key, side in sides if round_ % 2 == 0 else sides[::-1]:
                log(f"round {round_ + 1}/{rounds}: {side.name}")
                results[key].append(_measure(side, quick, raw=False, stream=False))
    d, o = results["default"], results["one"]
    blocks = []
    for latency in (10.0, 2.0):
        key = f"span{latency:g}"
        blocks.append(
            Block(
                name=f"processes.{AT_ONCE}@{latency:g}s",
                target=f"{AT_ONCE} turns at once, model at {latency:g} s: a process per core against one process",
                figure=_med(d, key),
                baseline=_med(o, key),
                baseline_label="one process, 256 threads",
                unit="s",
                limit=None,
                details={"default": _spread(d, key), "one": _spread(o, key)},
            )
        )
    blocks.append(
        Block(
            name="processes.throughput",
            target="turns/s at saturation: a process per core against one process",
            figure=_med(d, "turns_per_s"),
            baseline=_med(o, "turns_per_s"),
            baseline_label="one process, 256 threads",
            unit="turns/s",
            limit=None,
            higher_is_better=True,
            details={
                "default": _spread(d, "turns_per_s"),
                "one": _spread(o, "turns_per_s"),
                "cpu": f"ms per turn, default {_spread(d, 'cpu_ms')}; one {_spread(o, 'cpu_ms')}",
            },
        )
    )
    return blocks

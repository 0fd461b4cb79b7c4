"""The floor: the side-by-side's graph run in-process, no queue: `python -m bench.peer_floor COUNT`.

bench/peer_graph.py's graph (the one both sides run: chatq's nodes, tools and prompt on a stock
`ChatOpenAI`) invoked COUNT times one after another in this process against the stub
(OPENAI_BASE_URL), after a warm-up. Prints one JSON line: `cpu_ms` per turn (process CPU, all
threads) and `turns`. What a side costs beyond this is its own machinery.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def _turns(graph: Any, count: int, label: str) -> int:
    ok = 0
    for i in range(count):
        state = await graph.ainvoke({"messages": [{"role": "user", "content": f"{label} {i}"}]})
        ok += bool(state.get("messages"))
    return ok


def measure(count: int) -> dict[str, float]:
    from bench.peer_graph import make_graph

    graph = make_graph()
    asyncio.run(_turns(graph, 8, "warm up"))
    started = time.process_time()
    ok = asyncio.run(_turns(graph, count, "turn"))
    cpu = time.process_time() - started
    return {"cpu_ms": 1000 * cpu / count, "turns": float(count), "ok": float(ok)}


def main(argv: list[str]) -> int:
    print(json.dumps(measure(int(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

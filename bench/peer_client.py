"""The side-by-side's client, in a process of its own for either side: `python -m bench.peer_client SPEC`.

Its CPU is counted the same way for both sides: the process's CPU (all threads, `time.process_time`)
from the first submit to the last reply, reported by the client itself. chatq's client is the
Python producer API (`create_session` + `submit_turn` from 8 threads; raw task messages with
`"raw": true`) with its replies seen on pub/sub; the peer's client is one thread per run in flight,
each POSTing `/threads/{id}/runs/wait` (the thread created by the run).

Protocol: SPEC is JSON (`side`, `count`, `latency`, `raw`, `url`, `threads`). The client prepares
(imports, connections, subscription), prints `ready`, waits for a line on stdin, runs the phase
and prints one JSON line: `first_submit`, `last_reply`, `submit_s`, `ok`, `cpu_s`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODEL = "gpt-4o-mini"


def contents(count: int, latency: float, label: str = "turn") -> list[str]:
    """The turns' texts: the stub answers `[sleep: S]` after S seconds, the rest at once."""
    return [f"[sleep: {latency:g}] {label} {i}" if latency else f"{label} {i}" for i in range(count)]


def run_client(spec: dict[str, Any], *, before: Callable[[], None], after: Callable[[], None]) -> dict[str, Any]:
    """Start a client process, call `before()` once it is ready, start its phase, `after()` when it reported."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.peer_client", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"peer client did not start: {line!r}")
        before()
        process.stdin.write("go\n")
        process.stdin.flush()
        result: dict[str, Any] = json.loads(process.stdout.readline())
        after()
        return result
    finally:
        process.stdin.close()
        process.wait(30)


def _chatq(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from bench.common import EventCapture

    capture = EventCapture().__enter__()
    texts = contents(spec["count"], spec["latency"])

    def submit(chunk: list[str]) -> list[uuid.UUID]:
        from worker.producer import create_session, submit_turn

        if spec.get("raw"):
            return [_send_raw(text) for text in chunk]
        return [submit_turn(create_session(framework="langgraph", model=MODEL), text).turn_id for text in chunk]

    def phase() -> dict[str, Any]:
        threads = spec.get("threads", 8)
        first = time.time()
        with ThreadPoolExecutor(threads) as pool:
            ids = [turn for part in pool.map(submit, [texts[i::threads] for i in range(threads)]) for turn in part]
        submitted = time.time() - first
        capture.wait_all(ids, timeout=spec["timeout"])
        ends, ok = [], 0
        for turn in ids:
            events = capture.of(turn)
            ok += bool(events) and events[-1][1].get("type") == "final"
            if events:
                ends.append(events[-1][0])
        return {"first_submit": first, "last_reply": max(ends, default=float("nan")), "submit_s": submitted, "ok": ok}

    # Imported and connected before `ready`: the phase measures turns, not start-up.
    from worker.producer import create_session

    create_session(framework="langgraph", model=MODEL)
    return phase


def _send_raw(content: str) -> uuid.UUID:
    """A turn as another language's producer sends it: only the task message (the worker stores it)."""
    from worker.app import app

    turn_id, session_id = uuid.uuid4(), uuid.uuid4()
    kwargs = {"turn_id": str(turn_id), "session_id": str(session_id), "content": content, "images": None}
    app.send_task("chatq.run_turn", kwargs={**kwargs, "reply_to": None}, task_id=str(turn_id), queue="chatq")
    return turn_id


def _peer(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    import httpx

    texts = contents(spec["count"], spec["latency"])
    threads = min(spec["threads"], len(texts))
    client = httpx.Client(base_url=spec["url"], timeout=spec["timeout"], limits=httpx.Limits(max_connections=threads))
    client.get("/ok")
    ends: list[float] = []
    ok = [0]
    lock = threading.Lock()

    def one(text: str) -> None:
        body = {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": text}]}}
        response = client.post(f"/threads/{uuid.uuid4()}/runs/wait", json={**body, "if_not_exists": "create"})
        now = time.time()
        good = response.status_code == 200 and bool((response.json() or {}).get("messages"))
        with lock:
            ends.append(now)
            ok[0] += good

    def phase() -> dict[str, Any]:
        first = time.time()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, texts))
        return {"first_submit": first, "last_reply": max(ends), "submit_s": float("nan"), "ok": ok[0]}

    return phase


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    phase = _chatq(spec) if spec["side"] == "chatq" else _peer(spec)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.process_time()
    result = phase()
    result["cpu_s"] = time.process_time() - started
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

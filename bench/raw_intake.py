"""Issue 32 (part 2): a raw task message must cost no more than the producer API, in-process.

`python -m bench raw_intake [--quick]`, or `python -m bench.raw_intake [--turns N] [--rounds R]
[--threads T]` for more samples or turns run side by side from T threads (the contention a worker
process with many turns in flight sees).

Both sides run the whole way of one turn in this process against the stub (instant answers), each
turn in a new session, as `bench/peer_client.py` and the Celery task do:

- **API**: `create_session` + `submit_turn` (the producer), then the task body's
  `parse_turn_request` + `execute_turn` (the worker).
- **raw**: another language's producer: only the task message is sent (`app.send_task`), the
  worker's task body stores the session, turn and user message at the claim.

Neither side's message is consumed (no Celery): both pile up in the private Redis db alike.
Blocks of turns alternate A B B A in every round, so both sides share the machine's load. Figures
per turn and side: this process's CPU (`time.process_time`, all threads), the CPU of this run's
Postgres backends (their /proc/<pid>/schedstat, found by database name: Postgres on this machine; the
shared WAL writer is not counted), and statements and round trips to Postgres counted by
SQLAlchemy's events (BEGIN and COMMIT each one round trip): a figure the machine's load does not
move. Target: raw <= 1.0x the API.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from bench.common import Block, Stub, isolated_services, log, median, use_stub

MODEL = "gpt-4o-mini"
TEXT = "hello there, how are you today"
SIDES = ("api", "raw")


class Counter:
    """Statements and round trips to Postgres, from SQLAlchemy's engine events (every engine)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)

    def install(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        def statement(*_: Any, **__: Any) -> None:
            self.counts["statements"] += 1

        def transactional(conn: Any) -> bool:
            # An autocommit connection sends no BEGIN or COMMIT, though the events still fire.
            return bool(conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT")

        def begin(conn: Any) -> None:
            self.counts["begins"] += transactional(conn)

        def commit(conn: Any) -> None:
            self.counts["commits"] += transactional(conn)

        event.listen(Engine, "before_cursor_execute", statement)
        event.listen(Engine, "begin", begin)
        event.listen(Engine, "commit", commit)

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


def backend_pids() -> list[int]:
    """This database's Postgres backends (the pool's connections), by pid."""
    from sqlalchemy import text

    from models.db import autocommit_scope

    with autocommit_scope() as db:
        return [
            int(pid)
            for pid in db.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars()
        ]


def _pid_cpu(pid: int) -> float:
    """A process's CPU seconds, to the nanosecond (/proc/<pid>/schedstat; /proc/<pid>/stat counts
    10 ms ticks, too coarse for statements of a tenth of a millisecond)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return 0.0


@contextmanager
def measured(counter: Counter, into: dict[str, float]) -> Iterator[None]:
    """Add this block's process CPU, backend CPU and statement counts to `into`."""
    pids0 = backend_pids()
    pg0 = {pid: _pid_cpu(pid) for pid in pids0}
    counts0 = counter.snapshot()
    cpu0 = time.process_time()
    yield
    cpu = time.process_time() - cpu0
    counts = counter.snapshot()
    pids = set(pids0) | set(backend_pids())
    into["cpu"] += cpu
    into["pg"] += sum(_pid_cpu(pid) - pg0.get(pid, 0.0) for pid in pids)
    for key in ("statements", "begins", "commits"):
        into[key] += counts.get(key, 0) - counts0.get(key, 0)


def _sides() -> dict[str, Callable[[str], None]]:
    from worker.app import app
    from worker.payload import parse_turn_request
    from worker.producer import create_session, submit_turn
    from worker.runtime.delivery.process import current_runtime
    from worker.runtime.delivery.runner import execute_turn

    runtime = current_runtime()

    def task_body(kwargs: dict[str, Any], task_id: str) -> None:
        request = parse_turn_request(kwargs, task_id=task_id, settings=runtime.settings)
        result = execute_turn(request, queue="chatq", worker="raw_intake@bench", runtime=runtime)
        if result.outcome.value != "succeeded":
            raise RuntimeError(f"turn {request.turn_id}: {result.outcome} {result.error}")

    def api(content: str) -> None:
        turn = submit_turn(create_session(framework="langgraph", model=MODEL), content)
        kwargs = {"turn_id": str(turn.turn_id), "session_id": str(turn.session_id), "content": content}
        task_body({**kwargs, "images": None, "reply_to": None}, str(turn.turn_id))

    def raw(content: str) -> None:
        # bench/peer_client.py's raw producer: the message only, for a session nobody created.
        turn_id, session_id = uuid.uuid4(), uuid.uuid4()
        kwargs = {"turn_id": str(turn_id), "session_id": str(session_id), "content": content, "images": None}
        app.send_task("chatq.run_turn", kwargs={**kwargs, "reply_to": None}, task_id=str(turn_id), queue="chatq")
        task_body({**kwargs, "reply_to": None}, str(turn_id))

    return {"api": api, "raw": raw}


def measure(turns: int, rounds: int, threads: int) -> dict[str, Any]:
    """`rounds` rounds of A B B A blocks of `turns` turns each (from `threads` threads)."""
    import worker.wiring  # noqa: F401  (the hooks a worker process wires; the runner needs them)

    counter = Counter()
    sides = _sides()
    for name in SIDES:  # warm-up: clients, graph, pools, prepared statements
        for _ in range(10):
            sides[name](TEXT)
    counter.install()
    totals: dict[str, dict[str, float]] = {name: defaultdict(float) for name in SIDES}
    per_round: dict[str, list[float]] = {name: [] for name in SIDES}
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        for round_ in range(rounds):
            spent = {name: defaultdict(float) for name in SIDES}
            for name in ("api", "raw", "raw", "api") if round_ % 2 == 0 else ("raw", "api", "api", "raw"):
                with measured(counter, spent[name]):
                    if pool is None:
                        for _ in range(turns):
                            sides[name](TEXT)
                    else:
                        list(pool.map(sides[name], [TEXT] * turns))
            for name in SIDES:
                per_round[name].append((spent[name]["cpu"] + spent[name]["pg"]) / (2 * turns) * 1000)
                for key, value in spent[name].items():
                    totals[name][key] += value
            log(
                f"round {round_ + 1}: API {per_round['api'][-1]:.2f} ms, raw {per_round['raw'][-1]:.2f} ms "
                f"(process + Postgres backends, per turn; load {os.getloadavg()[0]:.2f})"
            )
    finally:
        if pool is not None:
            pool.shutdown()
    n = 2 * turns * rounds
    out: dict[str, Any] = {"turns": n, "threads": threads, "load": os.getloadavg()[0]}
    for name in SIDES:
        t = totals[name]
        out[name] = {
            "cpu_ms": t["cpu"] / n * 1000,
            "pg_ms": t["pg"] / n * 1000,
            "statements": t["statements"] / n,
            "round_trips": (t["statements"] + t["begins"] + t["commits"]) / n,
            "transactions": t["begins"] / n,
            "rounds_ms": per_round[name],
        }
    ratios = [raw / api for raw, api in zip(per_round["raw"], per_round["api"], strict=True)]
    out["ratio_median"] = median(ratios)
    out["ratios"] = ratios
    return out


def report(result: dict[str, Any]) -> None:
    print(
        f"per turn, {result['turns']} turns a side, {result['threads']} thread(s), in-process, model {MODEL} "
        f"on the stub, load {result['load']:.2f}"
    )
    print(
        f"  {'side':<5} {'process':>9} {'postgres':>9} {'sum':>9} {'statements':>11} {'round trips':>12}"
        f" {'transactions':>13}"
    )
    for name in SIDES:
        r = result[name]
        print(
            f"  {name:<5} {r['cpu_ms']:7.2f}ms {r['pg_ms']:7.2f}ms {r['cpu_ms'] + r['pg_ms']:7.2f}ms "
            f"{r['statements']:11.2f} {r['round_trips']:12.2f} {r['transactions']:13.2f}"
        )
    ratios = ", ".join(f"{value:.3f}" for value in result["ratios"])
    print(f"  raw / API (process + postgres) per round: {ratios}; median {result['ratio_median']:.3f}x")


def _run(turns: int, rounds: int, threads: int) -> dict[str, Any]:
    with isolated_services("raw_intake") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        return measure(turns, rounds, threads)


def run(quick: bool = False) -> list[Block]:
    result = _run(turns=25 if quick else 100, rounds=2 if quick else 4, threads=1)
    report(result)
    api, raw = result["api"], result["raw"]
    details = {
        "process": f"API {api['cpu_ms']:.2f} ms, raw {raw['cpu_ms']:.2f} ms",
        "postgres": f"API {api['pg_ms']:.2f} ms, raw {raw['pg_ms']:.2f} ms (this run's backends)",
        "trips": f"API {api['round_trips']:.2f}, raw {raw['round_trips']:.2f} round trips to Postgres per turn",
        "rounds": ", ".join(f"{value:.3f}x" for value in result["ratios"]),
        "load": f"{result['load']:.2f}",
    }
    return [
        Block(
            name="raw_intake.cpu_per_turn",
            target="a raw task message's turn costs <= 1.0x the producer API's (process + Postgres CPU)",
            figure=raw["cpu_ms"] + raw["pg_ms"],
            baseline=api["cpu_ms"] + api["pg_ms"],
            unit="ms",
            limit=1.0,
            baseline_label="create_session + submit_turn + the task body",
            details=details,
        )
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="turns per block (4 blocks a round)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    report(_run(args.turns, args.rounds, args.threads))


if __name__ == "__main__":
    main()

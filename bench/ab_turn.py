"""Issue 32 (part 2): one turn's cost under two versions of chatq, side by side in the same run.

`python -m bench.ab_turn [--a main] [--b .] [--turns 40] [--rounds 4] [--side api|raw]`

Each version runs in a child process of its own, from its own tree: `.` is this checkout as it is
(uncommitted changes included), anything else a git ref exported with `git archive` to a temporary
directory. Each child makes its own throw-away database and Redis db and its own stub, warms up
(clients, graph, pools, prepared statements), then runs blocks of `--turns` turns when told, the
whole way of a turn in-process as `bench/raw_intake.py` does (`api`: `create_session` +
`submit_turn` + the task body; `raw`: a raw task message, the worker stores session and turn;
`session`: every turn in one session, so the history grows and is trimmed to its budget).
Blocks alternate A B B A (then B A A B), so both versions share the machine's load; both children
stay alive for the whole run.

Per block: the child's CPU (all threads) plus its Postgres backends' CPU (/proc/<pid>/schedstat),
and statements and round trips to Postgres (SQLAlchemy events: a count the load does not move).
Printed: ms per turn of each side per round, the ratio B / A per round with its spread, and
`os.getloadavg()` beside each round. Nothing here asserts an absolute time: on a shared, loaded
machine only the ratio within a round means anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _wrap_stage(stage: str, spent: dict[str, float]) -> None:
    """Charge the CPU and wall time of calls to `module:attr` (where its caller looks it up) to `spent`."""
    import functools
    import importlib

    module_name, attr = stage.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, attr)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent["stage_cpu"] += time.process_time() - c0
            spent["stage_wall"] += time.perf_counter() - w0

    setattr(module, attr, timed)


def _one_session() -> Any:
    """The `session` side: every turn in one session, so each reads a growing history (trimmed to
    the budget once it is long), as the producer API and the task body run it."""
    from bench.raw_intake import MODEL
    from worker.payload import parse_turn_request
    from worker.producer import create_session, submit_turn
    from worker.runtime.delivery.process import current_runtime
    from worker.runtime.delivery.runner import execute_turn

    runtime = current_runtime()
    session_id = create_session(framework="langgraph", model=MODEL)

    def one(content: str) -> None:
        turn = submit_turn(session_id, content)
        kwargs = {"turn_id": str(turn.turn_id), "session_id": str(session_id), "content": content}
        request = parse_turn_request(
            {**kwargs, "images": None, "reply_to": None}, task_id=str(turn.turn_id), settings=runtime.settings
        )
        result = execute_turn(request, queue="chatq", worker="ab@bench", runtime=runtime)
        if result.outcome.value != "succeeded":
            raise RuntimeError(f"turn {request.turn_id}: {result.outcome} {result.error}")

    return one


def _raw_as_the_task_runs_it() -> Any:
    """The `raw` side: `bench/raw_intake.py`'s raw producer (the message only, for a session nobody
    created), its turn run as the task body runs it: told the message has no chatq header where the
    runner takes that (`execute_turn(stored=...)`)."""
    import inspect
    import uuid

    from worker.app import app
    from worker.payload import parse_turn_request
    from worker.runtime.delivery.process import current_runtime
    from worker.runtime.delivery.runner import execute_turn

    runtime = current_runtime()
    told = {"stored": False} if "stored" in inspect.signature(execute_turn).parameters else {}

    def raw(content: str) -> None:
        turn_id, session_id = uuid.uuid4(), uuid.uuid4()
        kwargs = {"turn_id": str(turn_id), "session_id": str(session_id), "content": content, "images": None}
        app.send_task("chatq.run_turn", kwargs={**kwargs, "reply_to": None}, task_id=str(turn_id), queue="chatq")
        request = parse_turn_request({**kwargs, "reply_to": None}, task_id=str(turn_id), settings=runtime.settings)
        result = execute_turn(request, queue="chatq", worker="ab@bench", runtime=runtime, **told)
        if result.outcome.value != "succeeded":
            raise RuntimeError(f"turn {request.turn_id}: {result.outcome} {result.error}")

    return raw


def _child(side: str, stages: list[str]) -> None:
    """The child: runs in a tree given by CHATQ_AB_TREE (its modules first on sys.path)."""
    tree = os.environ["CHATQ_AB_TREE"]
    # Run as a script, this file's directory leads sys.path: its modules would shadow the stdlib's.
    here = Path(__file__).resolve().parent
    sys.path[:] = [tree, *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    from collections import defaultdict

    import worker
    from bench.common import Stub, isolated_services, use_stub
    from bench.raw_intake import TEXT, Counter, _sides, measured

    assert Path(worker.__file__).resolve().is_relative_to(Path(tree).resolve()), worker.__file__
    with isolated_services("ab") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        import worker.wiring  # the hooks a worker process wires; the runner needs them

        sides = _sides()
        sides["session"] = _one_session()
        sides["raw"] = _raw_as_the_task_runs_it()
        for _ in range(10):
            sides[side](TEXT)
        counter = Counter()
        counter.install()
        staged: dict[str, float] = defaultdict(float)
        for stage in stages:
            _wrap_stage(stage, staged)
        print("ready", flush=True)
        for line in sys.stdin:
            turns = int(line)
            if turns <= 0:
                break
            spent: dict[str, float] = defaultdict(float)
            staged.clear()
            w0 = time.perf_counter()
            with measured(counter, spent):
                for _ in range(turns):
                    sides[side](TEXT)
            spent["wall"] = time.perf_counter() - w0
            spent.update(staged)
            print(json.dumps(dict(spent)), flush=True)


def _tree(ref: str, scratch: Path, label: str) -> Path:
    if ref == ".":
        return ROOT
    target = scratch / label
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


class Side:
    """One version's child process."""

    def __init__(self, label: str, tree: Path, side: str, stages: list[str]) -> None:
        self.label = label
        env = {**os.environ, "CHATQ_AB_TREE": str(tree), "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", side, *(f"--stage={s}" for s in stages)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{self.label}: child did not start ({line!r})")

    def block(self, turns: int) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{turns}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: child exited")
        return dict(json.loads(line))

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("0\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _per_turn(blocks: list[dict[str, float]], turns: int) -> dict[str, float]:
    n = turns * len(blocks)
    total = {key: sum(block.get(key, 0.0) for block in blocks) for key in blocks[0]}
    return {
        "ms": (total["cpu"] + total["pg"]) / n * 1000,
        "proc_ms": total["cpu"] / n * 1000,
        "pg_ms": total["pg"] / n * 1000,
        "wall_ms": total["wall"] / n * 1000,
        "trips": (total.get("statements", 0) + total.get("begins", 0) + total.get("commits", 0)) / n,
        "stage_cpu_ms": total.get("stage_cpu", 0.0) / n * 1000,
        "stage_wall_ms": total.get("stage_wall", 0.0) / n * 1000,
    }


def run(a: str, b: str, turns: int, rounds: int, side: str, stages: list[str]) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="chatq_ab_"))
    sides: dict[str, Side] = {}
    try:
        trees = {"A": _tree(a, scratch, "A"), "B": _tree(b, scratch, "B")}
        sides = {label: Side(label, tree, side, stages) for label, tree in trees.items()}
        for child in sides.values():
            child.wait_ready()
        per_round: list[dict[str, dict[str, float]]] = []
        for round_ in range(rounds):
            load = os.getloadavg()
            order = ("A", "B", "B", "A") if round_ % 2 == 0 else ("B", "A", "A", "B")
            blocks: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
            for label in order:
                blocks[label].append(sides[label].block(turns))
            figures = {label: _per_turn(blocks[label], turns) for label in ("A", "B")}
            per_round.append(figures)
            print(
                f"round {round_ + 1} (load {load[0]:.2f} {load[1]:.2f}): "
                f"A {figures['A']['ms']:6.2f} ms  B {figures['B']['ms']:6.2f} ms  "
                f"B/A {figures['B']['ms'] / figures['A']['ms']:.3f}  "
                f"(wall A {figures['A']['wall_ms']:.2f} B {figures['B']['wall_ms']:.2f}; "
                f"round trips A {figures['A']['trips']:.2f} B {figures['B']['trips']:.2f})",
                flush=True,
            )
            if stages:
                print(
                    f"   stages {'+'.join(stages)}: CPU A {figures['A']['stage_cpu_ms']:.3f} B"
                    f" {figures['B']['stage_cpu_ms']:.3f} ms, wall A {figures['A']['stage_wall_ms']:.3f}"
                    f" B {figures['B']['stage_wall_ms']:.3f} ms per turn",
                    flush=True,
                )
    finally:
        for child in sides.values():
            child.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = sorted(r["B"]["ms"] / r["A"]["ms"] for r in per_round)
    wall = sorted(r["B"]["wall_ms"] / r["A"]["wall_ms"] for r in per_round)
    mean = {
        label: {key: statistics.fmean(r[label][key] for r in per_round) for key in per_round[0][label]}
        for label in ("A", "B")
    }
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"A = {a}, B = {b}; side {side}; {rounds} rounds of A B B A blocks of {turns} turns; load now {load}")
    for label in ("A", "B"):
        m = mean[label]
        print(
            f"  {label}: {m['ms']:6.2f} ms/turn CPU (process {m['proc_ms']:.2f} + postgres {m['pg_ms']:.2f}),"
            f" wall {m['wall_ms']:.2f} ms, {m['trips']:.2f} round trips to Postgres"
            + (f"; stages CPU {m['stage_cpu_ms']:.3f} ms, wall {m['stage_wall_ms']:.3f} ms" if stages else "")
        )
    print(
        f"  B/A CPU: median {statistics.median(ratios):.3f} (spread {ratios[0]:.3f} .. {ratios[-1]:.3f});"
        f" wall: median {statistics.median(wall):.3f} ({wall[0]:.3f} .. {wall[-1]:.3f})"
    )
    return {"ratios": ratios, "wall": wall, "mean": mean}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default="main", help="git ref, or . for this checkout (default main)")
    parser.add_argument("--b", default=".", help="git ref, or . for this checkout (default)")
    parser.add_argument("--turns", type=int, default=40, help="turns per block (4 blocks a round)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--side",
        choices=("api", "raw", "session"),
        default="api",
        help="api: a new session per turn; raw: raw task messages; session: every turn in one session (history)",
    )
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        help="module:attr to time as well, where its caller looks it up (worker.runtime.delivery.runner:open_journal)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.stage)
        return
    run(args.a, args.b, args.turns, args.rounds, args.side, args.stage)


if __name__ == "__main__":
    main()

"""Durable steps under kill -9: model requests per turn, duplicate side effects, replies as a fault-free
run's, and the journal's CPU on the hot path (issue 28).

`python -m bench.durability [--turns 200] [--kills 5] [--rounds 4] [--framework langgraph]
[--latency 0.2] [--concurrency 8]` (also `python -m bench durability`). Every turn is a session of
its own asking for `rounds` rounds of a tool with a visible side effect (`tests.support.effects`:
each call appends its idempotency key to the turn's file, not safe to repeat); the model is the
test stub over HTTP, `latency` seconds before each answer. Two `chatq worker` processes run them,
sweeping by themselves with the fault tests' short lease (3 s), so a killed worker's turns are taken
over within seconds. Four phases on the same services, each with fresh workers:

- `clean` / `clean-off`: the batch without faults, with the journal and without it (the plugin
  `bench.journal_off`): the workers' CPU per journal step (a model step, a call started, its
  result: 3 per round) side by side, the fault-free number of model requests, the reference reply;
- `kills` / `kills-off`: the batch under `kills` kill -9 of a worker's whole process group, spread
  over the run (each when another share of the turns has finished; the killed worker is started
  again at once), with the journal and without it.

Figures: model requests per turn against the fault-free run's, duplicate side effects (a key
written twice, or more lines than rounds: a restarted turn's calls have new keys; target 0),
turns whose stored messages equal the fault-free run's, turns that ended "outcome unknown"
(killed between a call's start and its recorded result: the documented policy for a tool not
safe to repeat), and the CPU ratio. Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.common import Block, Subprocess, chatq_worker, isolated_services, log, print_block, proc_cpu, use_stub

MODEL = "gpt-4o-mini"
RECOVERY_ENV = {
    "CHATQ_LEASE_SECONDS": "3",
    "CHATQ_SWEEP_INTERVAL": "1",
    "CHATQ_REQUEUE_GRACE": "3",
    "CHATQ_RETRY_DELAY": "0.2",
    "CHATQ_WORKER_SWEEP": "on",
}
"""The fault tests' recovery timing (tests/support/workers.py): a takeover within seconds."""
KEY = re.compile(r"#run-([0-9a-f]{32})")


class RecordingStub(Subprocess):
    """tests.support.openai_stub in its own process, keeping request bodies (counted per turn)."""

    def __init__(self, *, latency: float) -> None:
        command = [sys.executable, "-m", "tests.support.openai_stub", "--latency", str(latency)]
        super().__init__("durability-stub", command, os.environ, ready="http://")
        self.base_url = ""

    def start(self, timeout: float = 30.0) -> RecordingStub:
        super().start(timeout)
        self.base_url = self.log().strip().splitlines()[0]
        return self

    def requests_per_key(self) -> collections.Counter[str]:
        """How many model requests each turn (its `#run-KEY` marker) made."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/_requests", timeout=60) as response:
            bodies = json.loads(response.read())
        counts: collections.Counter[str] = collections.Counter()
        for body in bodies:
            found = KEY.search(json.dumps(body.get("messages")))
            if found:
                counts[found[1]] += 1
        return counts


def _workers(base_url: str, services: dict[str, str], concurrency: int, journal: bool) -> list[Subprocess]:
    plugins = "tests.support.effects" + ("" if journal else ",bench.journal_off")
    env = {**services, **RECOVERY_ENV, "OPENAI_BASE_URL": base_url, "CHATQ_PLUGINS": plugins}
    tag = "on" if journal else "off"
    return [chatq_worker(concurrency=concurrency, env=env, name=f"dur-{tag}{i}") for i in range(2)]


def _submit(turns: int, rounds: int, framework: str, folder: Path) -> dict[uuid.UUID, tuple[str, Path]]:
    """Turns of `rounds` side-effect rounds, each its own session: turn id -> (key, its file)."""
    from tests.support.effects import EFFECT
    from worker.producer import create_session, submit_turn

    submitted: dict[uuid.UUID, tuple[str, Path]] = {}
    for _ in range(turns):
        key = uuid.uuid4().hex
        path = folder / key[:12] / "out.txt"
        path.parent.mkdir(parents=True)
        content = f'work [rounds: {rounds} {EFFECT} {{"path": "{path}"}}] #run-{key}'
        session_id = create_session(framework=framework, model=MODEL, metadata={"tools": [EFFECT]})
        submitted[submit_turn(session_id, content).turn_id] = (key, path)
    return submitted


def _rows(ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    from sqlalchemy import select

    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        return {row.id: row for row in db.execute(select(Turn).where(Turn.id.in_(ids))).scalars()}


def _running_on() -> collections.Counter[str]:
    """Running turns per worker node name."""
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn, TurnStatus

    with session_scope() as db:
        rows = db.execute(
            select(Turn.worker, func.count()).where(Turn.status == TurnStatus.RUNNING).group_by(Turn.worker)
        )
        return collections.Counter({str(name): int(count) for name, count in rows})


def _shapes(ids: list[uuid.UUID], paths: dict[uuid.UUID, Path]) -> dict[uuid.UUID, str]:
    """Each turn's stored messages (roles, texts, calls and their arguments, its own file named alike)."""
    from sqlalchemy import select

    from models.db import session_scope
    from models.tables import ChatMessage

    shapes: dict[uuid.UUID, list[Any]] = collections.defaultdict(list)
    with session_scope() as db:
        for m in db.execute(
            select(ChatMessage).where(ChatMessage.turn_id.in_(ids)).order_by(ChatMessage.position)
        ).scalars():
            if m.role == "user":
                continue  # its text names the turn's own key and file
            calls = [(c["name"], json.dumps(c["args"])) for c in m.tool_calls or ()]
            shapes[m.turn_id].append((m.role, m.content, calls, m.tool_call_id is not None))
    return {t: json.dumps(shape).replace(str(paths[t]), "PATH") for t, shape in shapes.items()}


def run_phase(
    phase: str, stub: RecordingStub, services: dict[str, str], folder: Path, options: argparse.Namespace
) -> dict[str, Any]:
    """One batch on fresh workers: `clean*` without faults, `kills*` under `options.kills` kill -9."""
    journal, kills = not phase.endswith("-off"), options.kills if phase.startswith("kills") else 0
    workers = _workers(stub.base_url, services, options.concurrency, journal)
    killed = 0
    try:
        for worker in workers:
            worker.start()
        # Warm-up: each worker imports its model client and graph before anything is counted.
        warm = _submit(4, options.rounds, options.framework, folder / f"{phase}-warm")
        _wait(list(warm), timeout=120)
        cpu_before = sum(proc_cpu(worker.pid) for worker in workers)
        started = time.monotonic()
        submitted = _submit(options.turns, options.rounds, options.framework, folder / phase)
        ids = list(submitted)
        deadline = time.monotonic() + 120 + options.turns * options.rounds * options.latency * 4
        while time.monotonic() < deadline:
            done = sum(row.status.value in ("succeeded", "failed") for row in _rows(ids).values())
            if done >= len(ids):
                break
            if killed < kills and done >= len(ids) * killed / (kills + 1):
                after = _kill_one(workers, stub, services, options, journal)
                if after is not None:
                    workers, killed = after, killed + 1
            time.sleep(0.1)
        seconds = time.monotonic() - started
        cpu = 0.0 if kills else sum(proc_cpu(worker.pid) for worker in workers) - cpu_before
    finally:
        for worker in workers:
            worker.stop()
    rows = _rows(ids)
    requests = stub.requests_per_key()
    effects = {t: (path.read_text().splitlines() if path.exists() else []) for t, (_, path) in submitted.items()}
    return {
        "phase": phase,
        "turns": len(ids),
        "kills": killed,
        "seconds": seconds,
        "succeeded": sum(row.status.value == "succeeded" for row in rows.values()),
        "unknown_outcome": sum("is unknown" in (row.error or "") for row in rows.values()),
        "failed_other": sum(
            row.status.value == "failed" and "is unknown" not in (row.error or "") for row in rows.values()
        ),
        "taken_over": sum(row.deliveries > 1 for row in rows.values()),
        "model_requests": sum(requests[key] for key, _ in submitted.values()),
        # A call run twice: its key written twice (journal on), or, as a restarted turn's model asks
        # again under new call ids, more lines than rounds (journal off).
        "duplicate_effects": sum(
            max(len(lines) - len(set(lines)), len(lines) - options.rounds, 0) for lines in effects.values()
        ),
        "shapes": _shapes(ids, {t: path for t, (_, path) in submitted.items()}),
        "worker_cpu": None if kills else cpu,
        "steps": len(ids) * options.rounds * 3,
    }


def _kill_one(
    workers: list[Subprocess], stub: RecordingStub, services: dict[str, str], options: argparse.Namespace, journal: bool
) -> list[Subprocess] | None:
    """kill -9 the worker running the most turns (its process group) and start a new one in the
    background (the batch goes on meanwhile); None while no worker runs a turn."""
    running = _running_on()
    victim = max(workers, key=lambda w: running.get(getattr(w, "hostname", ""), 0))
    turns = running.get(getattr(victim, "hostname", ""), 0)
    if not turns or victim.process is None:
        return None
    os.killpg(victim.pid, signal.SIGKILL)
    victim.process.wait(10)
    victim.stop()
    log(f"killed {victim.name} ({turns} turns running)")
    replacement = _workers(stub.base_url, services, options.concurrency, journal)[0]
    threading.Thread(target=replacement.start, name="restart", daemon=True).start()
    return [replacement if w is victim else w for w in workers]


def _wait(ids: list[uuid.UUID], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(row.status.value in ("queued", "running") for row in _rows(ids).values()):
        if time.monotonic() > deadline:
            raise RuntimeError("warm-up turns did not finish")
        time.sleep(0.2)


def measure(options: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.support.effects import effect_tools

    phases = ("clean", "clean-off", "kills", "kills-off")
    with (
        tempfile.TemporaryDirectory(prefix="chatq-durability-") as folder,
        isolated_services("durability") as services,
        RecordingStub(latency=options.latency) as stub,
        effect_tools(),
    ):
        stub.start()
        use_stub(stub.base_url)
        results = []
        for phase in phases:
            log(f"durability: {phase}, {options.turns} turns x {options.rounds} rounds ({options.framework})")
            results.append(run_phase(phase, stub, services, Path(folder), options))
            log(json.dumps({k: v for k, v in results[-1].items() if k != "shapes"}))
    return results


def blocks(results: list[dict[str, Any]]) -> list[Block]:
    by = {r["phase"]: r for r in results}
    clean, clean_off, kills, kills_off = by["clean"], by["clean-off"], by["kills"], by["kills-off"]
    reference = collections.Counter(clean["shapes"].values()).most_common(1)[0][0]

    def equal(r: dict[str, Any]) -> int:
        return sum(shape == reference for shape in r["shapes"].values())

    def per_turn(r: dict[str, Any]) -> float:
        return float(r["model_requests"]) / r["turns"]

    details = {
        "kills": f"{kills['kills']} kill -9 of a worker (journal off: {kills_off['kills']})",
        "taken_over": f"{kills['taken_over']} turns (journal off: {kills_off['taken_over']})",
        "unknown": f"{kills['unknown_outcome']} turns ended 'outcome unknown' (journal off: none can)",
        "other_fail": f"{kills['failed_other']} (journal off: {kills_off['failed_other']})",
    }
    cpu_on = clean["worker_cpu"] / clean["steps"] * 1000
    cpu_off = clean_off["worker_cpu"] / clean_off["steps"] * 1000
    return [
        Block(
            name="durability.model_requests_per_turn",
            target="at most the fault-free run's plus the requests in flight at the kills",
            figure=per_turn(kills),
            baseline=per_turn(clean),
            unit="requests",
            limit=None,
            baseline_label="fault-free run",
            details={**details, "journal_off": f"{per_turn(kills_off):.3f} requests per turn under the same kills"},
        ),
        Block(
            name="durability.duplicate_effects",
            target="0 side effects done twice",
            figure=float(kills["duplicate_effects"]),
            baseline=float(kills_off["duplicate_effects"]),
            unit="calls",
            limit=None,
            baseline_label="journal off, same kills",
        ),
        Block(
            name="durability.replies_equal",
            target="every turn that did not end 'outcome unknown' stores what the fault-free run stores",
            figure=float(equal(kills)),
            baseline=float(kills["turns"]),
            unit="turns",
            limit=None,
            baseline_label="turns",
            details={"journal_off": f"{equal(kills_off)} of {kills_off['turns']}", "clean": equal(clean)},
            higher_is_better=True,
        ),
        Block(
            name="durability.cpu_per_step",
            target="the journal costs little on the hot path (workers' CPU per journal step, fault-free)",
            figure=cpu_on,
            baseline=cpu_off,
            unit="ms",
            limit=None,
            baseline_label="journal off",
            details={"journal": f"{cpu_on - cpu_off:+.3f} ms of worker CPU per step ({clean['steps']} steps)"},
        ),
    ]


def _options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--framework", default="langgraph", choices=("langgraph", "plain_openai"))
    parser.add_argument("--latency", type=float, default=0.2, help="the stub's seconds before each answer")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker (two workers)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    return parser.parse_args(argv)


def run(quick: bool = False) -> list[Block]:
    """The benchmark framework's entry (`python -m bench durability`)."""
    return blocks(measure(_options(["--turns", "60", "--kills", "2"] if quick else [])))


def main(argv: list[str] | None = None) -> int:
    options = _options(argv)
    results = measure(options)
    out = blocks(results)
    for block in out:
        print_block(block)
    if options.json:
        Path(options.json).write_text(json.dumps([block.as_dict() for block in out], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

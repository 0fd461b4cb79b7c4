"""Per-stage CPU of one turn, in-process: `python -m bench.profile_turn [--turns N] [--model M] [--cprofile FILE]`.

Not one of the targets: a diagnostic for "where does a turn's CPU go". Turns are submitted with
`submit_turn` and run one at a time in this process with `worker.runner.execute_turn` (what the
Celery task calls), so everything except Celery itself is covered. Each stage is wrapped and
charged the process CPU time (`time.process_time`, all threads: LangGraph runs nodes on its own
threads) it used; stages nest (a publish inside the handler loop is also part of `run_handler`).
`--cprofile FILE` also writes a cProfile (process CPU timer) of the measured turns.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.common import Stub, create_sessions, isolated_services, use_stub

STAGES: list[tuple[str, str, str]] = [
    # (label, module, attribute): wrapped where the caller looks it up
    ("submit_turn", "worker.producer", "submit_turn"),
    ("  claims.insert_turn", "worker.claims", "insert_turn"),
    ("  send_task", "worker.producer", "send_turn"),
    ("execute_turn", "worker.runner", "execute_turn"),
    ("  claim_turn", "worker.claims", "claim_turn"),
    ("  TurnEvents.resume (last_seq)", "worker.runner", "TurnEvents.resume"),
    ("  run_handler", "worker.runner", "run_handler"),
    ("    get_agent_handler", "handlers", "get_agent_handler"),
    ("    build_history", "handlers.lc.turn", "build_history"),
    ("  complete_turn", "worker.claims", "complete_turn"),
    ("  kick_next", "worker.runner", "kick_next"),
    ("  lease register/unregister", "worker.leases", "LeaseKeeper.register"),
    ("every stream event, wherever published: TurnEvents.publish", "worker.events", "TurnEvents.publish"),
    ("  of which TurnEvents.send (JSON + one Redis pipeline)", "worker.events", "TurnEvents.send"),
]


def _wrap(totals: dict[str, float], counts: dict[str, int], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    depth = {"n": 0}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if depth["n"]:
            return fn(*args, **kwargs)
        depth["n"] += 1
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[label] += time.process_time() - t0
            counts[label] += 1
            depth["n"] -= 1

    return wrapper


def _install(totals: dict[str, float], counts: dict[str, int]) -> None:
    import importlib

    for label, module_name, attr in STAGES:
        module = importlib.import_module(module_name)
        owner: Any = module
        name = attr
        if "." in attr:
            cls_name, name = attr.split(".", 1)
            owner = getattr(module, cls_name)
        original = getattr(owner, name)
        if isinstance(owner, type) and isinstance(owner.__dict__.get(name), classmethod):
            func = owner.__dict__[name].__func__
            setattr(owner, name, classmethod(_wrap(totals, counts, label, func)))
        else:
            setattr(owner, name, _wrap(totals, counts, label, original))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--cprofile", default=None)
    args = parser.parse_args(argv)

    with isolated_services("profile") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        from worker import producer, runner
        from worker.payload import TurnRequest

        def one(session_id: Any) -> None:
            turn = producer.submit_turn(session_id, "hello there, how are you today")
            request = TurnRequest(
                turn_id=turn.turn_id, session_id=turn.session_id, content="hello there, how are you today"
            )
            result = runner.execute_turn(request, queue="chatq", worker="profile@bench")
            if result.outcome.value != "succeeded":
                raise RuntimeError(f"turn {turn.turn_id}: {result.outcome}")

        for session_id in create_sessions(5, model=args.model):
            one(session_id)  # warm-up: clients, graph, pools, prepared statements
        sessions = create_sessions(args.turns, model=args.model)
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        _install(totals, counts)
        profiler = None
        if args.cprofile:
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
        c0 = time.process_time()
        for session_id in sessions:
            one(session_id)
        total = time.process_time() - c0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)
    n = args.turns
    print(f"per-turn process CPU, {n} turns, model {args.model}, in-process (no Celery), pid {os.getpid()}")
    print(f"  {'total (submit + execute)':<60} {total / n * 1000:8.2f} ms")
    for label, _, _ in STAGES:
        if counts.get(label):
            print(f"  {label:<60} {totals[label] / n * 1000:8.2f} ms   ({counts[label] / n:.1f} calls/turn)")
    if args.cprofile:
        print(f"cProfile (process CPU timer) written to {args.cprofile}")


if __name__ == "__main__":
    main()

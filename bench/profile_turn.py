"""Per-stage CPU of one turn, in-process: `python -m bench.profile_turn [--turns N] [--model M] [--cprofile FILE]`.

Not one of the targets: a diagnostic for "where does a turn's CPU go". Turns are submitted with
`submit_turn` and run one at a time in this process with `worker.runtime.delivery.runner.execute_turn` (what the
Celery task calls), so everything except Celery itself is covered. Each stage is wrapped and
charged the process CPU time (`time.process_time`, all threads: LangGraph runs nodes on its own
threads) it used; stages nest (a publish inside the handler loop is also part of `run_handler`).
`--cprofile FILE` also writes a cProfile (process CPU timer) of the measured turns.

`--compare kombu_channel,redis_resp,openai_client` measures chatq's shortcuts (chatq/shortcuts/)
against the public API side by side instead: for each round and each named shortcut, 2 x `--turns`
turns alternating between the shortcut taken and its `ENABLED` off, then the per-turn CPU of the
stage it is on and of the whole turn for both sides, their ratios and the spread over `--rounds`.
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
    ("  claims.insert_turn", "worker.store.claims", "insert_turn"),
    ("  send_task", "worker.producer", "send_turn"),
    ("execute_turn", "worker.runtime.delivery.runner", "execute_turn"),
    ("  claim_message", "worker.store.claims", "claim_message"),
    ("    claims._claim_slow", "worker.store.claims", "_claim_slow"),
    ("    inserts.store_turn (ENSURE_TURN: raw messages, misses)", "worker.store.inserts", "store_turn"),
    ("  TurnEvents.resume (last_seq)", "worker.runtime.delivery.runner", "TurnEvents.resume"),
    ("  run_handler", "worker.runtime.delivery.runner", "run_handler"),
    ("    get_agent_handler", "handlers", "get_agent_handler"),
    ("    build_turn_input", "handlers.turn_input", "build_turn_input"),
    ("      trim_history (with the store's reads)", "handlers.turn_input", "trim_history"),
    ("  complete_turn", "worker.store.claims", "complete_turn"),
    ("  kick_next", "worker.runtime.delivery.runner", "kick_next"),
    ("  lease register/unregister", "worker.runtime.recovery.leases", "LeaseKeeper.register"),
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


SHORTCUTS = ("kombu_channel", "redis_resp", "openai_client", "control")
# The stage each shortcut is on (a label of STAGES); "control" switches nothing (the noise floor).
SHORTCUT_STAGE = {
    "control": "  run_handler",
    "kombu_channel": "  send_task",
    "redis_resp": "  of which TurnEvents.send (JSON + one Redis pipeline)",
    "openai_client": "  run_handler",
}


def _switch(name: str) -> Callable[[bool], None]:
    """A function selecting the shortcut (True) or the public API (False) for the next turn."""
    import importlib

    if name == "control":
        return lambda enabled: None
    module = importlib.import_module(f"chatq.shortcuts.{name}")
    if name != "openai_client":

        def select(enabled: bool) -> None:
            module.ENABLED = enabled

        return select
    from handlers.chat_models import models

    # The SDK client is chosen when a chat model is built (cached per model): keep one cache per
    # side, each built with the switch in its position, and swap the cache, not the switch.
    built = models._openai
    caches = {enabled: functools.lru_cache(maxsize=32)(built.__wrapped__) for enabled in (True, False)}

    def select_client(enabled: bool) -> None:
        module.ENABLED = enabled
        models._openai = caches[enabled]

    return select_client


def _compare(one: Callable[[Any], None], names: list[str], turns: int, rounds: int, model: str) -> None:
    """Turns alternate between the shortcut and the public API (ABAB..., so both sides share the
    machine's load); per-turn CPU of the shortcut's stage and of the whole turn, and their ratio."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    _install(totals, counts)
    ratios: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for round_ in range(rounds):
        for name in names:
            select = _switch(name)
            stage = SHORTCUT_STAGE[name]
            spent = {True: [0.0, 0.0], False: [0.0, 0.0]}  # [stage, whole turn]
            sessions = create_sessions(2 * turns + 4, model=model)
            for index, session_id in enumerate(sessions):
                enabled = (index + round_) % 2 == 0
                select(enabled)
                before = totals[stage]
                c0 = time.process_time()
                one(session_id)
                if index >= 4:  # the first turns of each side build its clients
                    spent[enabled][1] += time.process_time() - c0
                    spent[enabled][0] += totals[stage] - before
            select(True)
            on, off = ([value / turns * 1000 for value in spent[side]] for side in (True, False))
            ratios[name].append((off[0] / on[0], off[1] / on[1]))
            print(
                f"round {round_ + 1} {name:<14} stage {stage.strip()[:28]:<28} shortcut {on[0]:6.3f}"
                f" public {off[0]:6.3f} ms ({off[0] / on[0]:.3f}x);"
                f" turn {on[1]:6.3f} / {off[1]:6.3f} ms ({off[1] / on[1]:.3f}x)",
                flush=True,
            )
    print(f"public API / shortcut, CPU per turn, {turns} turns a side a round, {rounds} rounds, model {model}")
    for name in names:
        for what, column in (("stage", 0), ("turn", 1)):
            values = sorted(pair[column] for pair in ratios[name])
            print(
                f"  {name:<14} {what:<6} {values[0]:.3f}x to {values[-1]:.3f}x (median {values[len(values) // 2]:.3f}x)"
            )


def main(argv: list[str] | None = None) -> None:
    # The hooks a worker process wires (the Celery app imports it): the runner refuses to run without.
    import worker.wiring  # noqa: F401

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--cprofile", default=None)
    parser.add_argument("--compare", default=None, help="comma-separated shortcuts: " + ", ".join(SHORTCUTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--raw",
        action="store_true",
        help="turns as raw task messages: no submit_turn, the worker stores turn and session",
    )
    parser.add_argument(
        "--services",
        choices=("shared", "private"),
        default="shared",
        help="private: run against an own redis-server + Postgres cluster (bench.services), safe from neighbours",
    )
    args = parser.parse_args(argv)
    if args.services == "private" and not os.environ.get("CHATQ_BENCH_CHILD"):
        import subprocess
        import sys

        from bench.services import private_services

        # Re-run in a child: tests.support.services reads the URLs when it is imported.
        with private_services() as env:
            child = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--services", "private")]
            full = {**os.environ, **env, "CHATQ_BENCH_CHILD": "1"}
            subprocess.run([sys.executable, "-m", "bench.profile_turn", *child], env=full, check=True)
        return
    names = [name for name in (args.compare or "").split(",") if name]
    if any(name not in SHORTCUTS for name in names):
        parser.error(f"--compare takes any of {', '.join(SHORTCUTS)}")

    with isolated_services("profile") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        from worker import producer
        from worker.payload import TurnRequest
        from worker.runtime.delivery import runner
        from worker.runtime.delivery.process import current_runtime

        def one(session_id: Any) -> None:
            if args.raw:  # another language's producer: only the message, a session nobody created
                import uuid

                request = TurnRequest(turn_id=uuid.uuid4(), session_id=uuid.uuid4(), content="hello there")
                result = runner.execute_turn(request, queue="chatq", worker="profile@bench", runtime=current_runtime())
                if result.outcome.value != "succeeded":
                    raise RuntimeError(f"turn {request.turn_id}: {result.outcome}")
                return
            turn = producer.submit_turn(session_id, "hello there, how are you today")
            request = TurnRequest(
                turn_id=turn.turn_id, session_id=turn.session_id, content="hello there, how are you today"
            )
            result = runner.execute_turn(request, queue="chatq", worker="profile@bench", runtime=current_runtime())
            if result.outcome.value != "succeeded":
                raise RuntimeError(f"turn {turn.turn_id}: {result.outcome}")

        for session_id in create_sessions(5, model=args.model):
            one(session_id)  # warm-up: clients, graph, pools, prepared statements
        if names:
            _compare(one, names, args.turns, args.rounds, args.model)
            return
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

"""Target 2, pipeline overhead: CPU per turn of the whole pipeline vs the same handler called in-process.

Pipeline: N turns (each in its own pre-created session, so history is the same empty one for all)
are submitted with `submit_turn` one after the other from this process while a `chatq worker`
(defaults: threads pool, concurrency 32) runs them against the stub, which answers at once. CPU =
the worker process's utime+stime delta (/proc/<pid>/stat, all threads) from just before the first
submit until every turn has finished and the worker is idle again, plus this process's CPU inside
the `submit_turn` calls (thread CPU time). The stub, Redis and Postgres run in other processes and
are counted on neither side.

Baseline: the same handler class on the same model and stub, called in this process N times
(`handler.stream_turn(handler.prepare(text))` for `get_agent_handler(SessionInfo(...))`, drained, a
new empty session id each time, so history is read the same way), CPU = this process's CPU time.
Both sides are warmed up first.

Figures for `gpt-4o-mini` (through langchain-openai over HTTP to the stub) and the offline `echo`.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from bench.common import (
    Block,
    Stub,
    Subprocess,
    baseline_worker,
    chatq_worker,
    create_sessions,
    isolated_services,
    log,
    new_session_info,
    pg_statements,
    pg_statements_reset,
    proc_cpu,
    redis_commandstats,
    redis_delta,
    run_warmup,
    use_stub,
    wait_finished,
)
from bench.profile import profile_dir, record

TEXT = "hello there, how are you today"


def _settle(worker: Subprocess, quiet: float = 0.6, timeout: float = 10.0) -> float:
    """Wait until the worker's CPU stops moving (acks, task events, kick_next are done); its CPU then."""
    deadline = time.monotonic() + timeout
    last = proc_cpu(worker.pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = proc_cpu(worker.pid)
        if now - last <= 0.02:
            return now
        last = now
    return last


def _pipeline(worker: Subprocess, model: str, turns: int) -> dict[str, Any]:
    from worker.producer import submit_turn

    sessions = create_sessions(turns, model=model)
    cpu0 = _settle(worker)
    has_pgss = pg_statements_reset()
    redis0 = redis_commandstats()
    profiler = _producer_profiler()
    with record(worker.pid, f"pipeline_overhead-worker-{model}"):
        wall0 = time.monotonic()
        producer_cpu = 0.0
        turn_ids: list[uuid.UUID] = []
        for session_id in sessions:
            c0 = time.thread_time()
            if profiler is not None:
                profiler.enable()
            turn_ids.append(submit_turn(session_id, TEXT).turn_id)
            if profiler is not None:
                profiler.disable()
            producer_cpu += time.thread_time() - c0
        counts = wait_finished(turn_ids, timeout=120, poll=0.25)
        wall = time.monotonic() - wall0
        cpu1 = _settle(worker)
    _dump_profile(profiler, f"pipeline_overhead-producer-{model}")
    redis_rt = redis_delta(redis0, redis_commandstats(), turns)
    statements = pg_statements(turns) if has_pgss else ["(pg_stat_statements unavailable: use --services private)"]
    if counts.get("succeeded", 0) != turns:
        raise RuntimeError(f"pipeline {model}: not every turn succeeded: {counts}")
    return {
        "worker_cpu": cpu1 - cpu0,
        "producer_cpu": producer_cpu,
        "wall": wall,
        "redis": redis_rt,
        "statements": statements,
    }


def _producer_profiler() -> Any:
    if profile_dir() is None:
        return None
    import cProfile

    return cProfile.Profile(time.thread_time)  # CPU, not wall: waits on Postgres/Redis cost no CPU


def _dump_profile(profiler: Any, name: str) -> None:
    """Top functions of a cProfile run, by cumulative and by own time, next to the py-spy files."""
    directory = profile_dir()
    if profiler is None or directory is None:
        return
    import io
    import pstats

    directory.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(directory / f"{name}.pstats"))
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(35)
    stats.sort_stats("tottime").print_stats(20)
    (directory / f"{name}.txt").write_text(out.getvalue())
    print(f"   .. cProfile of {name}: {directory / (name + '.txt')}", flush=True)


def _in_process(model: str, turns: int) -> float:
    """CPU seconds of this process for `turns` handler calls (drained streams)."""
    from handlers import get_agent_handler
    from handlers.base import StreamEventKind

    def once() -> None:
        info = new_session_info(model)
        handler = get_agent_handler(info)
        final = [e for e in handler.stream_turn(handler.prepare(TEXT)) if e.kind == StreamEventKind.FINAL]
        if not final:
            raise RuntimeError("in-process handler gave no final event")

    for _ in range(5):
        once()
    profiler = _producer_profiler()
    c0 = time.process_time()
    if profiler is not None:
        profiler.enable()
    for _ in range(turns):
        once()
    if profiler is not None:
        profiler.disable()
    used = time.process_time() - c0
    _dump_profile(profiler, f"pipeline_overhead-inprocess-{model}")
    return used


def _celery_floor(turns: int) -> dict[str, float]:
    """CPU of N bare Celery no-op tasks on the same broker and pool: what Celery alone costs per task."""
    import redis

    from bench import celery_baseline

    key = f"bench:noop:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(celery_baseline.BROKER_URL)
    with baseline_worker(concurrency=32) as worker:
        worker.start()
        for _ in range(5):
            celery_baseline.noop.apply_async(args=[key + ":warm"], queue=celery_baseline.QUEUE)
        while client.llen(key + ":warm") < 5:
            time.sleep(0.05)
        cpu0 = _settle(worker)
        producer = 0.0
        for _ in range(turns):
            c0 = time.thread_time()
            celery_baseline.noop.apply_async(args=[key], queue=celery_baseline.QUEUE)
            producer += time.thread_time() - c0
        deadline = time.monotonic() + 60
        while client.llen(key) < turns and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu1 = _settle(worker)
    client.close()
    return {"worker": (cpu1 - cpu0) / turns * 1000, "producer": producer / turns * 1000}


def _idle_rate(worker: Subprocess, seconds: float = 2.0) -> float:
    c0 = proc_cpu(worker.pid)
    time.sleep(seconds)
    return (proc_cpu(worker.pid) - c0) / seconds


def run(quick: bool = False) -> list[Block]:
    turns = 60 if quick else 200
    models = ("gpt-4o-mini", "echo")
    blocks: list[Block] = []
    with isolated_services("pipe") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        with chatq_worker() as worker:
            worker.start()
            run_warmup(None, models, turns_each=5)
            idle = _idle_rate(worker)
            results = {}
            for model in models:
                log(f"pipeline: {turns} turns, model {model}")
                results[model] = _pipeline(worker, model, turns)
                r = results[model]
                log(f"done: worker {r['worker_cpu']:.2f} s CPU, producer {r['producer_cpu']:.2f} s")
        base = {}
        for model in models:
            log(f"in-process: {turns} handler calls, model {model}")
            base[model] = _in_process(model, turns)
            log(f"done: {base[model]:.3f} s CPU")
        log(f"bare Celery: {turns} no-op tasks")
        floor = _celery_floor(turns)
        log(f"done: {floor}")
    for model in models:
        r = results[model]
        per_turn = (r["worker_cpu"] + r["producer_cpu"]) / turns * 1000
        baseline = base[model] / turns * 1000
        blocks.append(
            Block(
                name=f"pipeline_overhead.{model}",
                target="pipeline CPU per turn <= 1.3x the handler's CPU per call in-process",
                figure=per_turn,
                baseline=baseline,
                baseline_label="same handler + model + stub, called in-process",
                unit="ms",
                limit=1.3 if model != "echo" else None,
                details={
                    "split": f"worker {r['worker_cpu'] / turns * 1000:.2f} ms + producer "
                    f"{r['producer_cpu'] / turns * 1000:.2f} ms per turn ({turns} turns, {r['wall']:.1f} s wall)",
                    "idle": f"the idle worker burns {idle * 1000:.1f} ms CPU per second (included above)",
                    "cores": str(os.cpu_count()),
                    "redis": r["redis"],
                    "postgres": "\n               ".join(r["statements"]),
                },
            )
        )
    blocks.append(
        Block(
            name="pipeline_overhead.celery_floor",
            target="CPU per bare Celery no-op task (send + run), the floor under any pipeline (reported, no limit)",
            figure=floor["worker"] + floor["producer"],
            baseline=base[models[0]] / turns * 1000,
            baseline_label=f"in-process handler CPU per call ({models[0]})",
            unit="ms",
            limit=None,
            details={"split": f"worker {floor['worker']:.2f} ms + producer {floor['producer']:.2f} ms per task"},
        )
    )
    return blocks

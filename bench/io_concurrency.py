"""Target 1, I/O concurrency: 200 turns sent at once to ONE `chatq worker` whose model answers after S seconds.

Method. One worker (`chatq worker`, threads pool) with `--concurrency 200` and
CHATQ_WORKER_CONCURRENCY=200, warmed up with a few turns. Its consumer is paused (Celery
`cancel_consumer`), 200 turns in 200 sessions are submitted with `submit_turn` (so all 200 messages
wait in the queue together: "sent at once"), then the consumer is resumed (`add_consumer`). The stub
(its own process, backlog 1024) answers each request after S seconds (`[sleep: S]` in the message).

Figures: first `started_at` -> last `finished_at` of the 200 turns (Postgres clock) against the
ideal S; the in-flight peak from sampling `count(*) ... status = 'running'` every 100 ms and from
the stub's concurrent-request counter; the worker's RSS (sampled, /proc) peak minus its idle RSS
after warm-up, per in-flight turn; the worker's CPU (/proc, all threads) from the first start to the
last, per turn and as a share of one core: near 100% means the ramp is bounded by the turns' start-up
CPU through one interpreter lock. At S = 2 s the baseline is 200 bare Celery tasks that sleep 2 s on
the same broker and pool (bench/celery_baseline.py), paused and resumed the same way.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.common import (
    Block,
    EventCapture,
    Sampler,
    Stub,
    Subprocess,
    baseline_worker,
    chatq_worker,
    create_sessions,
    isolated_services,
    log,
    proc_cpu_seconds,
    proc_status,
    run_warmup,
    use_stub,
    wait_finished,
)
from bench.profile import record

TURNS = 200
MODEL = "gpt-4o-mini"


def _pause(app: Any, hostname: str, queue: str) -> None:
    replies = app.control.cancel_consumer(queue, destination=[hostname], reply=True, timeout=5)
    if not replies:
        raise RuntimeError(f"worker {hostname} did not answer cancel_consumer")


def _resume(app: Any, hostname: str, queue: str) -> None:
    replies = app.control.add_consumer(queue, destination=[hostname], reply=True, timeout=5)
    if not replies:
        raise RuntimeError(f"worker {hostname} did not answer add_consumer")


def _running_count(turn_ids: list[uuid.UUID]) -> int:
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn, TurnStatus

    with session_scope() as db:
        return int(
            db.execute(
                select(func.count()).where(Turn.id.in_(turn_ids), Turn.status == TurnStatus.RUNNING)
            ).scalar_one()
        )


def _pg_connections() -> int:
    from sqlalchemy import text

    from models.db import session_scope

    with session_scope() as db:
        return int(
            db.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'chatq'"
                )
            ).scalar_one()
        )


def _starts(turn_ids: list[uuid.UUID]) -> tuple[float, float]:
    """Epoch seconds of the first and the last start, from Postgres (same host clock as ours)."""
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        row = db.execute(
            select(
                func.extract("epoch", func.min(Turn.started_at)), func.extract("epoch", func.max(Turn.started_at))
            ).where(Turn.id.in_(turn_ids))
        ).one()
    return float(row[0]), float(row[1])


def _ramp_cpu(samples: list[dict[str, float]], first: float, last: float) -> tuple[float, float]:
    """(worker CPU seconds, wall seconds) between the samples just before `first` and just after `last`."""
    before = [s for s in samples if "cpu" in s and s["t"] <= first]
    after = [s for s in samples if "cpu" in s and s["t"] >= last]
    if not before or not after:
        return 0.0, 0.0
    return after[0]["cpu"] - before[-1]["cpu"], after[0]["t"] - before[-1]["t"]


def _describe_ramp(cpu: float, window: float) -> str:
    if not window:
        return "not sampled"
    return (
        f"worker CPU from the first start to the last: {cpu:.2f} s ({1000 * cpu / TURNS:.1f} ms per turn), "
        f"{100 * cpu / window:.0f}% of one core over the {window:.2f} s between the samples around them"
    )


def _span(turn_ids: list[uuid.UUID]) -> tuple[float, float, float]:
    """(first start -> last finish, first start -> last start, median duration) from Postgres."""
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        row = db.execute(
            select(
                func.extract("epoch", func.max(Turn.finished_at) - func.min(Turn.started_at)),
                func.extract("epoch", func.max(Turn.started_at) - func.min(Turn.started_at)),
                func.percentile_cont(0.5).within_group(func.extract("epoch", Turn.finished_at - Turn.started_at)),
            ).where(Turn.id.in_(turn_ids))
        ).one()
    return float(row[0]), float(row[1]), float(row[2])


def _chatq_run(worker: Subprocess, stub: Stub, latency: float) -> dict[str, Any]:
    from worker.app import app
    from worker.producer import submit_turn

    hostname = worker.hostname  # type: ignore[attr-defined]
    sessions = create_sessions(TURNS, model=MODEL)
    _pause(app, hostname, "chatq")
    t0 = time.monotonic()
    turn_ids = [submit_turn(s, f"[sleep: {latency:g}] turn {i}").turn_id for i, s in enumerate(sessions)]
    submit_s = time.monotonic() - t0
    stub.reset_stats()
    infra_before = worker.log().count("infrastructure error")

    def probe() -> dict[str, float]:
        return {
            "running": _running_count(turn_ids),
            "rss": proc_status(worker.pid, "VmRSS"),
            "threads": proc_status(worker.pid, "Threads"),
            "pg_conns": _pg_connections(),
            "cpu": proc_cpu_seconds(worker.pid),
        }

    with Sampler(probe, 0.1) as sampler, record(worker.pid, f"io_concurrency-worker-{latency:g}s"):
        _resume(app, hostname, "chatq")
        counts = wait_finished(turn_ids, timeout=latency * 4 + 60)
    span, start_spread, median_turn = _span(turn_ids)
    first_start, last_start = _starts(turn_ids)
    # The ramp is bounded by the worker's CPU when this is near one core (one interpreter lock).
    ramp_cpu, ramp_window = _ramp_cpu(sampler.samples, first_start, last_start)
    return {
        "ramp_cpu": ramp_cpu,
        "ramp_window": ramp_window,
        "span": span,
        "start_spread": start_spread,
        "median_turn": median_turn,
        "submit_s": submit_s,
        "counts": counts,
        "peak_running": sampler.peak("running"),
        "peak_stub": stub.stats()["peak"],
        "peak_rss_kb": sampler.peak("rss"),
        "peak_threads": sampler.peak("threads"),
        "peak_pg_conns": sampler.peak("pg_conns"),
        "infra_errors": worker.log().count("infrastructure error") - infra_before,
    }


def _baseline_run(seconds: float) -> dict[str, Any]:
    import json

    import redis

    from bench import celery_baseline

    key = f"bench:sleep:{uuid.uuid4().hex}"
    worker = baseline_worker(concurrency=TURNS)
    try:
        worker.start()
        hostname = worker.hostname  # type: ignore[attr-defined]
        _pause(celery_baseline.app, hostname, celery_baseline.QUEUE)
        for _ in range(TURNS):
            celery_baseline.sleep.apply_async(args=[key, seconds], queue=celery_baseline.QUEUE)
        client = redis.Redis.from_url(celery_baseline.BROKER_URL)
        _resume(celery_baseline.app, hostname, celery_baseline.QUEUE)
        deadline = time.monotonic() + seconds * 4 + 60
        while client.llen(key) < TURNS and time.monotonic() < deadline:
            time.sleep(0.1)
        times = [json.loads(x) for x in client.lrange(key, 0, -1)]
        client.close()
    finally:
        worker.stop()
    if len(times) < TURNS:
        raise RuntimeError(f"baseline: only {len(times)} of {TURNS} sleep tasks ran")
    first = min(t[0] for t in times)
    return {"span": max(t[1] for t in times) - first, "start_spread": max(t[0] for t in times) - first}


def run(quick: bool = False) -> list[Block]:
    latencies = (10.0, 2.0)
    blocks: list[Block] = []
    with isolated_services("io") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        env = {"CHATQ_WORKER_CONCURRENCY": str(TURNS)}
        with chatq_worker(concurrency=TURNS, env=env) as worker:
            worker.start()
            with EventCapture():
                run_warmup(None, [MODEL], turns_each=3)
            time.sleep(0.5)
            idle_rss_kb = proc_status(worker.pid, "VmRSS")
            results = {}
            for latency in latencies:
                log(f"{TURNS} turns, model answers after {latency:g} s")
                results[latency] = _chatq_run(worker, stub, latency)
                log(f"done: {results[latency]}")
            hwm_kb = proc_status(worker.pid, "VmHWM")
        log("baseline: 200 bare Celery tasks sleeping 2 s")
        base = _baseline_run(2.0)
        log(f"done: {base}")

    for latency in latencies:
        r = results[latency]
        counts = r["counts"]
        ok = counts.get("succeeded", 0)
        details = {
            "in-flight": f"peak {r['peak_running']:.0f} running in Postgres, {r['peak_stub']} concurrent at the model",
            "turns": f"{ok}/{TURNS} succeeded {dict(counts)}; {r['infra_errors']} infrastructure-error retries",
            "starts": f"last start {r['start_spread']:.2f} s after the first; median turn {r['median_turn']:.2f} s",
            "submit": f"200 submit_turn calls took {r['submit_s']:.2f} s (before the consumer resumed)",
            "worker": f"peak {r['peak_threads']:.0f} threads, {r['peak_pg_conns']:.0f} Postgres connections",
            "ramp": _describe_ramp(r["ramp_cpu"], r["ramp_window"]),
        }
        blocks.append(
            Block(
                name=f"io_concurrency.{latency:g}s",
                target=f"200 turns at {latency:g} s model latency, first start -> last finish <= ideal / 0.9",
                figure=r["span"],
                baseline=latency,
                baseline_label="ideal: the model latency",
                unit="s",
                limit=1 / 0.9 if latency >= 10 else None,
                details=details,
            )
        )
    two = results[2.0]
    blocks.append(
        Block(
            name="io_concurrency.2s_vs_celery",
            target="200 turns at 2 s beside 200 bare Celery tasks sleeping 2 s, same pool (reported, no limit)",
            figure=two["span"],
            baseline=base["span"],
            baseline_label=f"bare Celery threads pool; its last start {base['start_spread']:.2f} s after the first",
            unit="s",
            limit=None,
        )
    )
    peak_rss_kb = max(results[x]["peak_rss_kb"] for x in latencies)
    per_turn_mib = (peak_rss_kb - idle_rss_kb) / TURNS / 1024
    blocks.append(
        Block(
            name="io_concurrency.memory",
            target="peak RSS per in-flight turn (reported, no limit)",
            figure=per_turn_mib,
            baseline=idle_rss_kb / 1024,
            baseline_label="idle worker RSS after warm-up; ratio = per-turn / idle",
            unit="MiB",
            limit=None,
            details={
                "rss": f"idle {idle_rss_kb / 1024:.0f} MiB, peak {peak_rss_kb / 1024:.0f} MiB, "
                f"VmHWM {hwm_kb / 1024:.0f} MiB"
            },
        )
    )
    return blocks

"""Schedules (issue 30, part 2): how late a tick's turn starts, fired by the workers themselves.

Two `chatq worker`s (the project's defaults: each fires due schedules on its due timer, every
CHATQ_DUE_INTERVAL = 1 s) and the
benchmarks' stub (bench/stub.py), which stamps the arrival of every model request carrying
`[mark: KEY]` with `time.time()` (same machine, same clock). One schedule, `every=5` with a session
template (each run a new `plain_openai` session: one model request per run), runs for 60 s; for
each tick:

- started: the turn's `started_at` (its claim) minus the tick's instant;
- first request: the arrival of its model request at the stub minus the tick's instant.

Both are informational (no target yet): p50 and p99 printed, with the machine's load average
before and after.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid

from bench.common import Block, Stub, chatq_worker, isolated_services, log, percentile, use_stub

MODEL = "gpt-4o-mini"
EVERY = 5.0
"""Seconds between ticks."""
FIRE_CADENCE = "1"
"""CHATQ_DUE_INTERVAL of the workers (the default, said here so the figure names it)."""


def _marks(stub: Stub) -> dict[str, list[float]]:
    with urllib.request.urlopen(stub.base_url.removesuffix("/v1") + "/_marks", timeout=10) as response:
        data: dict[str, list[float]] = json.loads(response.read())
        return data


def _load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def _spread(values: list[float]) -> str:
    return f"p50 {percentile(values, 50):.1f} ms, p99 {percentile(values, 99):.1f} ms, {len(values)} ticks"


def _measure(stub: Stub, seconds: float) -> tuple[list[float], list[float]]:
    """Run one schedule for `seconds`; the delays (ms) to each run's start and first model request."""
    from sqlalchemy import select

    from models.db import session_scope
    from models.tables import Turn
    from worker.producer import create_schedule, delete_schedule, pause_schedule

    key = uuid.uuid4().hex
    schedule = create_schedule(
        session_template={"framework": "plain_openai", "model": MODEL},
        content=f"[mark: {key}] what time is it?",
        every=EVERY,
        overlap="enqueue",
    )
    time.sleep(seconds)
    pause_schedule(schedule.id)
    time.sleep(3)  # the last runs reach the model
    ticks = [schedule.created_at.timestamp() + EVERY * k for k in range(1, int(seconds / EVERY) + 1)]
    with session_scope() as db:
        started = sorted(
            row.timestamp()
            for row in db.execute(select(Turn.started_at).where(Turn.schedule_id == schedule.id)).scalars()
            if row is not None
        )
    delete_schedule(schedule.id)
    arrivals = sorted(_marks(stub).get(key, []))
    count = min(len(ticks), len(started), len(arrivals))
    if count < len(ticks) - 1:
        raise RuntimeError(f"{len(ticks)} ticks but {len(started)} runs started, {len(arrivals)} requests seen")
    to_start = [(started[i] - ticks[i]) * 1000 for i in range(count)]
    to_request = [(arrivals[i] - ticks[i]) * 1000 for i in range(count)]
    return to_start, to_request


def run(quick: bool = False) -> list[Block]:
    seconds = 11.0 if quick else 60.0
    load_before = _load()
    env = {"CHATQ_DUE_INTERVAL": FIRE_CADENCE}
    with isolated_services("schedules"), Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        with chatq_worker(env=env, name="sched-a") as first, chatq_worker(env=env, name="sched-b") as second:
            first.start()
            second.start()
            log(f"one schedule every {EVERY:g} s for {seconds:g} s on two workers (fired every {FIRE_CADENCE} s)")
            to_start, to_request = _measure(stub, seconds)
    load = f"1/5/15-min load average {load_before} before, {_load()} after ({os.cpu_count()} cores)"
    details = {
        "started": _spread(to_start) + " (tick -> the turn's claim)",
        "first_request": _spread(to_request) + " (tick -> its model request at the stub)",
        "load": load,
    }
    return [
        Block(
            name="schedules.firing_delay_p50",
            target="tick -> first model request p50 (informational; the fire cadence is 1 s)",
            figure=percentile(to_request, 50),
            baseline=percentile(to_start, 50),
            baseline_label="tick -> the turn's claim p50",
            unit="ms",
            limit=None,
            details=details,
        ),
        Block(
            name="schedules.firing_delay_p99",
            target="tick -> first model request p99 (informational)",
            figure=percentile(to_request, 99),
            baseline=percentile(to_start, 99),
            baseline_label="tick -> the turn's claim p99",
            unit="ms",
            limit=None,
            details={"load": load},
        ),
    ]

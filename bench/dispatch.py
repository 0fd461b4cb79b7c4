"""Target 4, dispatch: submit -> handler start p50 against a bare Celery no-op task's send -> body start.

Chatq: one turn at a time, each in a new session, on an idle, warmed-up `chatq worker`; latency =
the `started` event's `ts` (stamped by the worker right after the claim, before the handler runs)
minus `time.time()` just before `submit_turn` (which writes the turn to Postgres, publishes `queued`
and sends the task). `ts` has millisecond resolution; the subscriber's receipt time is reported too.

Baseline: bench/celery_baseline.py's no-op task on the same broker, pool (threads) and Celery
settings; latency = the body's `time.time()` minus `time.time()` just before `apply_async`.
Target: chatq p50 <= 1.5x the baseline p50.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from bench.common import (
    Block,
    EventCapture,
    Stub,
    baseline_worker,
    chatq_worker,
    create_sessions,
    isolated_services,
    log,
    percentile,
    run_warmup,
    use_stub,
)

MODEL = "gpt-4o-mini"


_RECEIVED = re.compile(
    r'"ts": "(?P<iso>[^"]+)".*Task chatq\.run_turn\[(?P<id>[0-9a-f-]{36})\] received'
    r"|^\[(?P<text>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*Task chatq\.run_turn\[(?P<tid>[0-9a-f-]{36})\] received"
)


def _received_times(log_text: str) -> dict[str, float]:
    """When the worker logged each task as received (its log's millisecond timestamps)."""
    out: dict[str, float] = {}
    for line in log_text.splitlines():
        m = _RECEIVED.search(line)
        if not m:
            continue
        if m["iso"]:
            out[m["id"]] = datetime.fromisoformat(m["iso"]).timestamp()
        else:
            out[m["tid"]] = datetime.strptime(m["text"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


class _Stages:
    """Times the parts of submit_turn (in this process) by wrapping what it calls."""

    def __init__(self) -> None:
        from worker import producer

        self.producer = producer
        self.publish = 0.0
        self.send = 0.0
        self.sent_at = 0.0
        self._orig_send = producer.send_turn
        self._orig_publish = producer.TurnEvents.publish

    def __enter__(self) -> _Stages:
        stages = self

        def send_turn(*args: Any, **kwargs: Any) -> Any:
            stages.sent_at = t0 = time.time()
            try:
                return stages._orig_send(*args, **kwargs)
            finally:
                stages.send = time.time() - t0

        def publish(events: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return stages._orig_publish(events, *args, **kwargs)
            finally:
                stages.publish = time.time() - t0

        self.producer.send_turn = send_turn  # type: ignore[assignment]
        self.producer.TurnEvents.publish = publish  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.producer.send_turn = self._orig_send  # type: ignore[assignment]
        self.producer.TurnEvents.publish = self._orig_publish  # type: ignore[method-assign]


def _chatq(capture: EventCapture, count: int) -> dict[str, list[float]]:
    from worker.producer import submit_turn

    out: dict[str, list[float]] = defaultdict(list)
    turns: list[tuple[str, float, float]] = []
    with _Stages() as stages:
        for session_id in create_sessions(count, model=MODEL):
            time.sleep(0.05)  # the worker idles between turns, as a dispatch round trip assumes
            t0 = time.time()
            turn_id = submit_turn(session_id, "hello").turn_id
            t1 = time.time()
            if not capture.wait(turn_id, 30):
                raise RuntimeError(f"turn {turn_id} did not finish")
            started = [(t, e) for t, e in capture.of(turn_id) if e["type"] == "started"]
            received, event = started[0]
            out["start"].append((float(event["ts"]) - t0) * 1000)
            out["receipt"].append((received - t0) * 1000)
            out["submit"].append((t1 - t0) * 1000)
            out["submit_db"].append((t1 - t0 - stages.send - stages.publish) * 1000)
            out["submit_publish"].append(stages.publish * 1000)
            out["submit_send"].append(stages.send * 1000)
            turns.append((str(turn_id), stages.sent_at, float(event["ts"])))
    return out | {"_turns": turns}  # type: ignore[dict-item]


def _baseline(count: int) -> list[float]:
    import redis

    from bench import celery_baseline

    key = f"bench:noop:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(celery_baseline.BROKER_URL)
    out = []
    with baseline_worker(concurrency=32) as worker:
        worker.start()
        for i in range(count + 5):
            time.sleep(0.05)
            t0 = time.time()
            celery_baseline.noop.apply_async(args=[key], queue=celery_baseline.QUEUE)
            item = client.blpop([key], timeout=30)
            if item is None:
                raise RuntimeError("baseline no-op task did not run")
            if i >= 5:  # warm-up
                out.append((float(item[1]) - t0) * 1000)
    client.close()
    return out


def run(quick: bool = False) -> list[Block]:
    count = 15 if quick else 60
    with isolated_services("dispatch") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        with EventCapture() as capture, chatq_worker() as worker:
            worker.start()
            run_warmup(capture, [MODEL], turns_each=5)
            log(f"chatq: {count} turns, one at a time")
            res = _chatq(capture, count)
            received_at = _received_times(worker.log())
        for turn_id, sent_at, started_ts in res.pop("_turns"):  # type: ignore[arg-type]
            if turn_id in received_at:
                res["broker"].append((received_at[turn_id] - sent_at) * 1000)
                res["claim"].append((started_ts - received_at[turn_id]) * 1000)
        log(f"bare Celery: {count} no-op tasks, one at a time")
        base = _baseline(count)
    return [
        Block(
            name="dispatch.p50",
            target="submit_turn -> handler start p50 <= 1.5x a bare Celery no-op send -> body start p50",
            figure=percentile(res["start"], 50),
            baseline=percentile(base, 50),
            baseline_label="bare Celery no-op, same broker and pool",
            unit="ms",
            limit=1.5,
            details={
                "chatq": f"p50 {percentile(res['start'], 50):.2f} ms, p90 {percentile(res['start'], 90):.2f}, "
                f"p99 {percentile(res['start'], 99):.2f} (`started` ts; ms resolution)",
                "receipt": f"`started` received by a subscriber: p50 {percentile(res['receipt'], 50):.2f} ms",
                "stages": "p50 of each: "
                + ", ".join(
                    f"{label} {percentile(res[key], 50):.2f} ms"
                    for key, label in (
                        ("submit", "submit_turn"),
                        ("submit_db", "= its Postgres transaction"),
                        ("submit_publish", "+ `queued` publish"),
                        ("submit_send", "+ send_task"),
                        ("broker", "; send_task called -> worker logs received"),
                        ("claim", "; received -> `started` (claim)"),
                    )
                    if res.get(key)
                ),
                "baseline": f"p50 {percentile(base, 50):.2f} ms, p90 {percentile(base, 90):.2f}, "
                f"p99 {percentile(base, 99):.2f}",
            },
        )
    ]

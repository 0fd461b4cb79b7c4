"""A bare Celery app for the baselines: the same broker and the same Celery settings as chatq, no chatq.

Run as `celery -A bench.celery_baseline worker --pool threads ...` with `REDIS_URL` set. Its tasks
record when their body runs in Redis lists, so the benchmark reads the times back without a
result backend (chatq has none either).

The settings that shape dispatch are copied from celeryconfig.py (JSON, late acks, prefetch 1, task
events, no results), so the gap between a chatq turn and these tasks is chatq's own pipeline.
"""

from __future__ import annotations

import json
import os
import threading
import time

import redis
from celery import Celery

BROKER_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
QUEUE = "bench"

app = Celery("chatq_bench_baseline", broker=BROKER_URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    event_serializer="json",
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    task_send_sent_event=False,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 3600, "queue_order_strategy": "priority"},
)

_local = threading.local()


def _redis() -> redis.Redis:
    client = getattr(_local, "client", None)
    if client is None:
        client = redis.Redis.from_url(BROKER_URL)
        _local.client = client
    return client


@app.task(name="bench.noop")
def noop(key: str) -> None:
    """Record when the body started (the dispatch baseline: send -> task body start)."""
    started = time.time()
    _redis().rpush(key, repr(started))


@app.task(name="bench.sleep")
def sleep(key: str, seconds: float) -> None:
    """Sleep like a turn waiting on its model, recording [start, end] (the I/O concurrency baseline)."""
    started = time.time()
    time.sleep(seconds)
    _redis().rpush(key, json.dumps([started, time.time()]))

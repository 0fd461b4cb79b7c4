"""Turns run in the test process: what a real worker takes from the test's Redis queues, run on threads here.

`InProcessWorker` pops the same list items a `chatq worker` pops (BRPOP over `chatq`, `chatq.batch`,
`chatq.webhooks`, in that order of priority), checks each with the worker's own intake
(`worker.runtime.intake.intake.inspect`), drops the sent-marker on receipt as the worker's `task_received`
handler does, and runs what the Celery task bodies of `worker.runtime.intake.tasks` run: `execute_turn`
with a `Runtime` built here (lease length, hooks, retry policy from the test's settings), or one
webhook attempt (`worker.runtime.webhooks.deliveries.deliver`). A delivery the task would retry (the runner's
RETRY, BUSY or WAITING, an outage, a busy webhook) runs again after the same countdown, as Celery's
retry would send it. The real Postgres, Redis and model stub are used throughout; only the process,
its signals and Celery's consumer are not — tests about those keep a real worker
(`tests.support.workers`), and a test must not have both on one Redis db at once (`start` refuses).
"""

from __future__ import annotations

import heapq
import io
import itertools
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import Engine

from chatq.settings import Settings, get_settings
from models.db import get_engine
from tests.support.env import environ
from worker.dispatch import STORED_HEADER
from worker.errors import InvalidTurn
from worker.events import get_redis
from worker.markers import mark_taken
from worker.payload import BATCH_QUEUE, GUARDED_QUEUES, INTERACTIVE_QUEUE, TASK_NAME, parse_turn_request, parse_uuid
from worker.runtime.delivery.process import Runtime
from worker.runtime.delivery.runner import Outcome, Result, execute_turn, reject, retry_after_outage
from worker.runtime.intake import intake
from worker.runtime.policy.retry import RetryPolicy
from worker.runtime.recovery.leases import LeaseKeeper
from worker.storable import OUTAGE_ERRORS
from worker.wiring import get_hooks

WEBHOOK_TASK = "chatq.deliver_webhook"

# What tests/support/workers.py gives a real test worker, minus what only a process has (the
# sweep timer is off there too): the same lease length and retry delay make the same timings.
IN_PROCESS_ENV = {
    "CHATQ_LEASE_SECONDS": "3",
    "CHATQ_RETRY_DELAY": "0.2",
    "CHATQ_TURN_TIMEOUT": "20",
    "CHATQ_REQUEUE_GRACE": "3",
    "CHATQ_WORKER_SWEEP": "off",
}

_keepers: dict[tuple[Engine, float], LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def _lease_keeper(settings: Settings, engine: Engine) -> LeaseKeeper:
    """One keeper (one renewal thread) per engine and lease length for the whole test run, as a
    process has one; apart from the process's own (`get_lease_keeper`), as before."""
    with _keepers_lock:
        key = (engine, settings.lease_seconds)
        keeper = _keepers.get(key)
        if keeper is None:
            keeper = _keepers[key] = LeaseKeeper(
                engine=engine, lease_seconds=settings.lease_seconds, interval=settings.renewal_interval
            )
        return keeper


def build_runtime() -> Runtime:
    """A `Runtime` from the test's current settings (its lease length, retry policy), the default
    hooks, and the test's engine and Redis client (this harness is an edge, as a worker's task entry is)."""
    settings = get_settings()
    engine = get_engine()
    return Runtime(
        settings=settings,
        hooks=get_hooks(),
        leases=_lease_keeper(settings, engine),
        retry=RetryPolicy.from_settings(settings),
        engine=engine,
        redis=get_redis(),
    )


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """One task message as the worker would receive it."""

    task: str
    """The task's name (`chatq.run_turn` or `chatq.deliver_webhook`)."""
    task_id: str
    """The message's task id (a turn's id for `chatq.run_turn`)."""
    args: list[Any]
    """Positional arguments (chatq's tasks take none)."""
    kwargs: dict[str, Any]
    """Keyword arguments."""
    queue: str
    """The list the message was taken from."""
    retries: int
    """Celery's retry counter: how many times the task re-sent it."""
    stored: bool = False
    """Whether it carries chatq's header (`worker.dispatch.STORED_HEADER`): its turn was stored before it was sent."""


class InProcessWorker:
    """Runs the test's queued task messages on `threads` threads of this process until `stop`."""

    def __init__(self, redis_url: str, *, threads: int = 4, name: str = "in-process@test") -> None:
        self.redis_url = redis_url
        self.name = name
        self.threads = threads
        self.results: dict[uuid.UUID, list[Result]] = defaultdict(list)
        """Each turn's delivery results, in order."""
        self.errors: list[str] = []
        """What went wrong outside a turn's own handling (an item refused by intake, an exception)."""
        self._client = redis.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._later: list[tuple[float, int, Delivery]] = []
        self._order = itertools.count()
        self._busy = 0
        self._pool: list[threading.Thread] = []
        self._runtime: Runtime | None = None
        self._log = io.StringIO()
        self._log_handler = logging.StreamHandler(self._log)
        self._log_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._root_level = logging.NOTSET

    def start(self) -> InProcessWorker:
        """Start taking messages; refused while a real worker consumes this Redis db."""
        from tests.support.workers import live_workers

        rivals = [w.name for w in live_workers() if w.env.get("REDIS_URL") == self.redis_url]
        if rivals:
            raise RuntimeError(f"real workers {rivals} consume this Redis db: run in-process tests apart from them")
        self._runtime = build_runtime()
        # The process's webhook delivery slots are sized by the settings of their first use (a
        # worker's settings never change); this runtime's settings are the test's.
        from worker.runtime.webhooks import deliveries as webhooks

        with webhooks._slots_lock:
            webhooks._slots.pop(os.getpid(), None)
        # What a worker's log would show of the turns run here (INFO and up, tracebacks included).
        root = logging.getLogger()
        self._root_level = root.level
        root.setLevel(min(root.level, logging.INFO))
        root.addHandler(self._log_handler)
        for index in range(self.threads):
            thread = threading.Thread(target=self._loop, name=f"chatq-inprocess-{index}", daemon=True)
            thread.start()
            self._pool.append(thread)
        return self

    def stop(self, *, timeout: float = 30.0) -> None:
        """Finish the deliveries running now, stop, and drop what is still queued (no later test runs it)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._pool:
            thread.join(max(0.0, deadline - time.monotonic()))
        try:
            self._client.delete(*GUARDED_QUEUES)
        finally:
            self._client.close()
        root = logging.getLogger()
        root.removeHandler(self._log_handler)
        root.setLevel(self._root_level)
        stuck = [thread.name for thread in self._pool if thread.is_alive()]
        assert not stuck, f"in-process deliveries still running after {timeout}s: {stuck}"

    def log(self) -> str:
        """Everything logged in this process while the worker ran, a line per record."""
        self._log_handler.acquire()
        try:
            return self._log.getvalue()
        finally:
            self._log_handler.release()

    def log_line(self, *fragments: str, timeout: float = 20.0) -> str:
        """The first log line holding every fragment, waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log().splitlines():
                if all(fragment in line for fragment in fragments):
                    return line
            assert time.monotonic() < deadline, f"never logged {fragments!r}:\n{self.log()[-3000:]}"
            time.sleep(0.05)

    def wait_idle(self, *, timeout: float = 30.0) -> None:
        """Wait until nothing is queued, running or due later (every copy of every message processed)."""
        deadline = time.monotonic() + timeout
        calm = 0
        while calm < 2:  # twice in a row: a message just popped is counted busy a moment later
            calm = calm + 1 if self._idle() else 0
            assert time.monotonic() < deadline, f"in-process worker not idle after {timeout}s"
            time.sleep(0.02)

    def outcomes(self, turn_id: uuid.UUID) -> list[Outcome]:
        """The outcome of each delivery of a turn so far."""
        with self._lock:
            return [result.outcome for result in self.results.get(turn_id, [])]

    def _idle(self) -> bool:
        with self._lock:
            if self._busy or self._later:
                return False
        return sum(int(self._client.llen(queue)) for queue in GUARDED_QUEUES) == 0

    def _loop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            while not self._stop.is_set():
                delivery = self._due() or self._take(client)
                if delivery is None:
                    continue
                try:
                    self._run(delivery)
                except Exception as exc:  # the test fails on it (`errors`); the thread goes on
                    with self._lock:
                        self.errors.append(f"{delivery.task} {delivery.task_id}: {type(exc).__name__}: {exc}")
                finally:
                    with self._lock:
                        self._busy -= 1
        finally:
            client.close()

    def _due(self) -> Delivery | None:
        with self._lock:
            if self._later and self._later[0][0] <= time.monotonic():
                self._busy += 1
                return heapq.heappop(self._later)[2]
        return None

    def _take(self, client: redis.Redis) -> Delivery | None:
        popped = client.brpop(list(GUARDED_QUEUES), timeout=0.05)
        if not popped:
            return None
        with self._lock:
            self._busy += 1
        queue, raw = popped[0].decode(), popped[1]
        verdict = intake.inspect(raw, queue=queue, tasks=(TASK_NAME, WEBHOOK_TASK), limit=self._limit())
        if isinstance(verdict, intake.Refused):
            with self._lock:
                self.errors.append(f"refused an item of {queue}: {verdict.reason}")
                self._busy -= 1
            return None
        headers = verdict.payload["headers"]
        args, kwargs, _embed = _body(verdict.payload)
        delivery = Delivery(
            task=headers["task"],
            task_id=headers["id"],
            args=args,
            kwargs=kwargs,
            queue=queue,
            retries=int(headers.get("retries") or 0),
            stored=bool(headers.get(STORED_HEADER)),
        )
        if delivery.task == TASK_NAME:
            # As the worker's task_received handler (worker.ops.signals).
            mark_taken(self._runtime.redis if self._runtime else get_redis(), delivery.task_id, queue=queue)
        eta = headers.get("eta")
        if eta:
            delay = (datetime.fromisoformat(eta) - datetime.now(UTC)).total_seconds()
            if delay > 0:
                with self._lock:
                    self._busy -= 1
                self._schedule(delivery, delay, retried=False)
                return None
        return delivery

    def _limit(self) -> int:
        return intake.max_item_bytes(self._runtime.settings if self._runtime else get_settings())

    def _schedule(self, delivery: Delivery, delay: float, *, retried: bool = True) -> None:
        """Run the delivery again after `delay` seconds, as Celery's `self.retry(countdown=...)` would."""
        if retried:
            delivery = Delivery(**{**delivery.__dict__, "retries": delivery.retries + 1})
        with self._lock:
            heapq.heappush(self._later, (time.monotonic() + delay, next(self._order), delivery))

    def _run(self, delivery: Delivery) -> None:
        if delivery.task == WEBHOOK_TASK:
            self._deliver_webhook(delivery)
        else:
            self._run_turn(delivery)

    def _run_turn(self, delivery: Delivery) -> None:
        """What the `chatq.run_turn` task body does (worker/runtime/tasks.py), Celery's retry as a countdown here."""
        runtime = self._runtime
        assert runtime is not None
        queue = delivery.queue if delivery.queue in (INTERACTIVE_QUEUE, BATCH_QUEUE) else INTERACTIVE_QUEUE
        try:
            if delivery.args:
                raise InvalidTurn("chatq.run_turn takes keyword arguments only")
            request = parse_turn_request(delivery.kwargs, task_id=delivery.task_id, settings=runtime.settings)
        except InvalidTurn as exc:
            reject(*_ids(delivery), exc.message, runtime=runtime)
            return
        try:
            result = execute_turn(request, queue=queue, worker=self.name, runtime=runtime, stored=delivery.stored)
        except OUTAGE_ERRORS as exc:
            decision = retry_after_outage(request, exc, delivery.retries, runtime=runtime)
            self._schedule(delivery, decision.delay)
            return
        with self._lock:
            self.results[request.turn_id].append(result)
        if result.outcome in (Outcome.RETRY, Outcome.BUSY, Outcome.WAITING):
            countdown = result.retry_after if result.retry_after is not None else runtime.retry.agent_delay
            self._schedule(delivery, countdown)

    def _deliver_webhook(self, delivery: Delivery) -> None:
        """What the `chatq.deliver_webhook` task body does: one attempt, retried as it says."""
        from worker.runtime.webhooks.deliveries import DeliveryOutcome, deliver

        if delivery.args or set(delivery.kwargs) != {"delivery_id"}:
            raise InvalidTurn("chatq.deliver_webhook takes one keyword argument, delivery_id")
        delivery_id = parse_uuid(str(delivery.kwargs["delivery_id"]), "delivery_id")
        runtime = self._runtime
        assert runtime is not None
        try:
            result = deliver(delivery_id, runtime=runtime)
        except OUTAGE_ERRORS:
            self._schedule(delivery, runtime.retry.after_outage(delivery.retries).delay)
            return
        if result.outcome in (DeliveryOutcome.RETRY, DeliveryOutcome.BUSY):
            self._schedule(delivery, result.retry_after or 0.0)


def _body(payload: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    import base64
    import json

    text = payload["body"]
    if (payload.get("properties") or {}).get("body_encoding") == "base64":
        text = base64.b64decode(text).decode("utf-8")
    args, kwargs, embed = json.loads(text)
    return list(args), dict(kwargs), dict(embed)


def _ids(delivery: Delivery) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The turn and session ids of an invalid message, trusted as far as the task trusts them."""
    try:
        turn_id = uuid.UUID(delivery.task_id)
    except ValueError:
        turn_id = uuid.UUID(int=0)
    try:
        session_id: uuid.UUID | None = uuid.UUID(str(delivery.kwargs.get("session_id")))
    except ValueError:
        session_id = None
    return turn_id, session_id


@contextmanager
def in_process_worker(redis_url: str, *, threads: int = 4, **env: str) -> Iterator[InProcessWorker]:
    """An `InProcessWorker` under the test workers' settings (plus `env`), stopped afterwards; fails
    the test if anything outside a turn's own handling went wrong."""
    with environ(**{**IN_PROCESS_ENV, **env}):
        runner = InProcessWorker(redis_url, threads=threads).start()
        try:
            yield runner
        finally:
            runner.stop()
        assert not runner.errors, runner.errors

"""Prometheus metrics Flower cannot know: turn outcomes, latencies, tokens, retries, the sweeper, queues.

A worker serves them on `CHATQ_METRICS_PORT` (off when unset) at `/metrics`, on 127.0.0.1 unless
`CHATQ_METRICS_ADDR` says otherwise (the endpoint has no authentication). One Celery worker runs
turns on threads in one process, so plain process-local metrics are exact there (`serve_metrics`).
`chatq worker` with several processes serves one endpoint for all of them from its supervisor
(`worker.ops.service_metrics`): its processes run in prometheus_client's multiprocess mode, each
writing its values to files in one directory, and a scrape sums them, so every metric below keeps
its name and labels; each process lists its provider scopes there (`share_scopes`). A port that
cannot be bound is logged as an error; the worker runs on without the endpoint.

| metric | type | labels | meaning |
|---|---|---|---|
| chatq_turns_total | counter | status | turns that ended: succeeded, failed, cancelled |
| chatq_turn_retries_total | counter | | handler invocations retried after AgentInvocationError |
| chatq_turn_duration_seconds | histogram | framework | claim to stored reply, per attempt that succeeded |
| chatq_time_to_first_token_seconds | histogram | framework | claim to the first streamed text |
| chatq_tokens_total | counter | model, kind | prompt and completion tokens of succeeded turns |
| chatq_turns_paused_total | counter | framework | turns that paused for a person's approval (each pause) |
| chatq_approval_wait_seconds | histogram | outcome | a tool call's pause to its decision: approved, denied, timed_out |
| chatq_turns_in_flight | gauge | | turns this worker (every process of `chatq worker`) is running now |
| chatq_sweeper_actions_total | counter | action | resent (lost messages) and expired_lease (dead workers) |
| chatq_schedule_runs_total | counter | outcome | schedule ticks: run (a turn created) or skipped (overlap, misfire) |
| chatq_messages_set_aside_total | counter | queue | malformed queue items refused and moved to `chatq.dead` |
| chatq_queue_depth | gauge | queue | messages waiting in Redis per queue, read at scrape time |
| chatq_provider_requests_total | counter | model | turns given a slot under the model's limits |
| chatq_provider_refusals_total | counter | model, status | 429, 502/503/504/529, unreachable, timeout |
| chatq_provider_slot_waits_total | counter | model, reason | turns put back to wait for a slot, and why |
| chatq_provider_slot_wait_seconds_total | counter | model | seconds turns were told to wait for a slot |
| chatq_provider_allowed_rpm, _tpm, _concurrency | gauge | model | allowed now, fleet-wide (0: unlimited) |
| chatq_provider_in_flight | gauge | model | slots held across the fleet, read at scrape time |
| chatq_tenant_slots_total | counter | model, tenant | slots each tenant's turns were given (fleet-wide, from Redis) |
| chatq_tenant_yields_total | counter | model, tenant | free slots a tenant ahead of its share gave up (`fair_share`) |
| chatq_tenant_backlogged | gauge | model, tenant | 1 while any of the tenant's turns wait in line for the model |
| chatq_webhook_attempts_total | counter | outcome | webhook POSTs: delivered, retry (sent again later), failed |
| chatq_webhook_attempt_seconds | histogram | | how long one webhook POST took (connect to answer) |
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.runtime.observers import hook_points, hooks
from worker.runtime.policy import limits
from worker.runtime.policy.retry import RetryCause

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

TURNS = Counter("chatq_turns_total", "Turns that ended, by final status.", ["status"])
RETRIES = Counter("chatq_turn_retries_total", "Handler invocations retried after AgentInvocationError.")
TURN_SECONDS = Histogram(
    "chatq_turn_duration_seconds",
    "Claim to stored reply of a succeeded attempt.",
    ["framework"],
    buckets=_LATENCY_BUCKETS,
)
FIRST_TOKEN_SECONDS = Histogram(
    "chatq_time_to_first_token_seconds", "Claim to the first streamed text.", ["framework"], buckets=_LATENCY_BUCKETS
)
TOKENS = Counter("chatq_tokens_total", "Tokens of succeeded turns.", ["model", "kind"])
PAUSED = Counter("chatq_turns_paused_total", "Turns that paused for a person's approval of tool calls.", ["framework"])
APPROVAL_WAIT_SECONDS = Histogram(
    "chatq_approval_wait_seconds",
    "From a tool call's pause to its decision (approved, denied, timed_out).",
    ["outcome"],
    # People answer in seconds to a day (CHATQ_APPROVAL_TIMEOUT's default).
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400),
)
# livesum: under `chatq worker` the processes' values add up, and a process that died counts no more.
IN_FLIGHT = Gauge("chatq_turns_in_flight", "Turns this worker is running now.", multiprocess_mode="livesum")
SWEEPER = Counter("chatq_sweeper_actions_total", "Sweeper actions.", ["action"])
SCHEDULE_RUNS = Counter(
    "chatq_schedule_runs_total", "Schedule ticks: run (a turn created) or skipped (overlap, misfire).", ["outcome"]
)
WEBHOOK_ATTEMPTS = Counter(
    "chatq_webhook_attempts_total",
    "Webhook delivery attempts, by outcome: delivered, retry, failed (POSTs), refused (no POST: the address rule).",
    ["outcome"],
)
WEBHOOK_SECONDS = Histogram(
    "chatq_webhook_attempt_seconds", "One webhook POST, connect to answer.", buckets=_LATENCY_BUCKETS
)
SET_ASIDE = Counter(
    "chatq_messages_set_aside_total", "Queue items refused as malformed and moved to chatq.dead.", ["queue"]
)

PROVIDER_REQUESTS = Counter(
    "chatq_provider_requests_total", "Turns given a slot under the model's shared limits.", ["model"]
)
PROVIDER_REFUSALS = Counter(
    "chatq_provider_refusals_total", "Refusals by the model service (429, 503, ...).", ["model", "status"]
)
SLOT_WAITS = Counter("chatq_provider_slot_waits_total", "Turns put back to wait for a slot.", ["model", "reason"])
SLOT_WAIT_SECONDS = Counter(
    "chatq_provider_slot_wait_seconds_total", "Seconds turns were told to wait for a slot.", ["model"]
)


class MetricsHooks(hooks.TurnHooks):
    """Keeps the metrics above from the runtime's hook points (`worker.runtime.observers.hooks`, `.hook_points`)."""

    def provider_admitted(self, event: hook_points.ProviderAdmitted) -> None:
        PROVIDER_REQUESTS.labels(event.model).inc()

    def provider_refused(self, event: hook_points.ProviderRefused) -> None:
        PROVIDER_REFUSALS.labels(event.model, event.status).inc()

    def slot_wait(self, event: hook_points.SlotWait) -> None:
        SLOT_WAITS.labels(event.model, event.reason).inc()
        SLOT_WAIT_SECONDS.labels(event.model).inc(event.seconds)

    def sweep_resent(self, event: hook_points.SweepResent) -> None:
        SWEEPER.labels("resent").inc(event.resent)
        SWEEPER.labels("expired_lease").inc(event.expired_leases)

    def sweep_repaired(self, event: hook_points.SweepRepaired) -> None:
        SWEEPER.labels("repaired_event").inc(event.events)

    def schedule_fired(self, event: hook_points.ScheduleFired) -> None:
        SCHEDULE_RUNS.labels("run").inc(event.runs)
        SCHEDULE_RUNS.labels("skipped").inc(event.skipped)

    def webhook_attempt(self, event: hook_points.WebhookAttempt) -> None:
        if event.seconds is not None:
            WEBHOOK_SECONDS.observe(event.seconds)
        WEBHOOK_ATTEMPTS.labels(event.outcome).inc()

    def message_set_aside(self, event: hook_points.MessageSetAside) -> None:
        SET_ASIDE.labels(event.queue).inc()

    def before_claim(self, event: hooks.Claiming) -> None:
        share_scopes()  # scopes an earlier turn was admitted (or held) under

    def started(self, event: hooks.Started) -> None:
        IN_FLIGHT.inc()
        share_scopes()

    def ended(self, event: hooks.Ended) -> None:
        IN_FLIGHT.dec()

    def first_text(self, event: hooks.FirstText) -> None:
        FIRST_TOKEN_SECONDS.labels(event.turn.framework).observe(event.seconds)

    def succeeded(self, event: hooks.Succeeded) -> None:
        TURNS.labels("succeeded").inc()
        TURN_SECONDS.labels(event.turn.framework).observe(event.seconds)
        TOKENS.labels(event.turn.model, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(event.turn.model, "completion").inc(event.completion_tokens)

    def failed(self, event: hooks.Failed) -> None:
        TURNS.labels("failed").inc()

    def paused(self, event: hooks.Paused) -> None:
        PAUSED.labels(event.turn.framework or "").inc()

    def approval_waited(self, event: hooks.ApprovalWaited) -> None:
        APPROVAL_WAIT_SECONDS.labels(event.outcome).observe(event.seconds)

    def cancelled(self, event: hooks.Cancelled) -> None:
        # A turn cancelled while queued was counted by no worker before either: the one that
        # announces it at its claim only publishes the event.
        if not event.at_claim:
            TURNS.labels("cancelled").inc()

    def retried(self, event: hooks.Retried) -> None:
        if event.cause is RetryCause.AGENT_FAILURE:
            RETRIES.inc()


class QueueDepthCollector(Collector):
    """Reads the Redis queue lengths when Prometheus scrapes (nothing runs in between)."""

    def __init__(self, queues: tuple[str, ...] = ("chatq", "chatq.batch", "chatq.webhooks")) -> None:
        self.queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("chatq_queue_depth", "Messages waiting in Redis per queue.", labels=["queue"])
        try:
            from worker.events import get_redis

            client = get_redis()
            pipe = client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.llen(queue)
            for queue, depth in zip(self.queues, pipe.execute(), strict=True):
                family.add_metric([queue], float(depth))
        except Exception as exc:  # a scrape must not fail because Redis blinked
            log.debug("queue depth unavailable: %s", exc)
        yield family


class ProviderLimitsCollector(Collector):
    """Reads what the fleet allows each recently used model from Redis when Prometheus scrapes."""

    def __init__(self, scopes: Callable[[], Iterable[limits.Scope]] | None = None) -> None:
        self.scopes = scopes
        """The scopes to report: this process's (`limits.known_scopes`) unless given."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        names = ("rpm", "tpm", "concurrency", "in_flight")
        families = {
            name: GaugeMetricFamily(
                f"chatq_provider_{'in_flight' if name == 'in_flight' else 'allowed_' + name}",
                f"Model limit {name} across the fleet (0: unlimited).",
                labels=["model"],
            )
            for name in names
        }
        slots = CounterMetricFamily(
            "chatq_tenant_slots",
            "Slots each tenant's turns were given under a model's limits.",
            labels=["model", "tenant"],
        )
        yields = CounterMetricFamily(
            "chatq_tenant_yields",
            "Free slots a tenant's batch turns gave to tenants behind their share.",
            labels=["model", "tenant"],
        )
        backlogged = GaugeMetricFamily(
            "chatq_tenant_backlogged",
            "1 while any of a tenant's turns wait in line for a model.",
            labels=["model", "tenant"],
        )
        try:
            from worker.events import get_redis

            for scope in (self.scopes or limits.known_scopes)():
                now = limits.state(get_redis(), scope)
                for name, value in zip(names, (now.rpm, now.tpm, now.max_concurrent, now.in_flight), strict=True):
                    families[name].add_metric([scope.model], float(value))
                for share in limits.shares(get_redis(), scope):
                    slots.add_metric([scope.model, share.tenant], float(share.granted))
                    yields.add_metric([scope.model, share.tenant], float(share.yielded))
                    backlogged.add_metric([scope.model, share.tenant], 1.0 if share.backlogged else 0.0)
        except Exception as exc:  # a scrape must not fail because Redis blinked
            log.debug("provider limits unavailable: %s", exc)
        yield from families.values()
        yield from (slots, yields, backlogged)


DIRECTORY_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's variable: set, its metrics keep their values in files in that directory."""
SCOPES_PREFIX = "scopes_"
"""`scopes_<pid>.json`: the provider scopes one process used (prometheus_client reads only `*.db`)."""

_started: dict[str, Any] = {}
_lock = threading.Lock()


def serve_metrics(port: int | None, addr: str) -> int | None:
    """Start the /metrics endpoint once per process on `port` (CHATQ_METRICS_PORT; None: no endpoint);
    returns the port or None.

    It has no authentication, so it listens on `addr` (CHATQ_METRICS_ADDR, 127.0.0.1 unless set):
    exposing it (0.0.0.0 for a Prometheus on another host or container) is the operator's explicit
    choice. A port that cannot be bound (taken, not permitted) is logged as an error and gives None.
    """
    if port is None:
        return None
    with _lock:
        if _started.get("pid") == os.getpid():
            return int(_started["port"])
        if "collector" not in _started:
            collector = QueueDepthCollector()
            REGISTRY.register(collector)
            REGISTRY.register(ProviderLimitsCollector())
            _started["collector"] = collector
        if start_endpoint(port, addr, REGISTRY) is None:
            return None
        _started.update(pid=os.getpid(), port=port)
    return port


def start_endpoint(port: int, addr: str, registry: CollectorRegistry) -> WSGIServer | None:
    """Serve `registry` at http://addr:port/metrics on a daemon thread; None (and an ERROR line) if
    the port cannot be bound."""
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.error("cannot serve metrics on %s:%d: %s; running on without them", addr, port, exc)
        return None
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return server


def multiprocess_directory() -> Path | None:
    """The service's directory when this process is one of `chatq worker`'s processes, else None."""
    value = os.environ.get(DIRECTORY_ENV)
    return Path(value) if value else None


_shared = {"count": 0}
_share_lock = threading.Lock()


def share_scopes() -> None:
    """In a process of the service: list the provider scopes it used for the supervisor's scrape,
    when they changed (a new model or base URL is rare; otherwise this is a length comparison)."""
    directory = multiprocess_directory()
    if directory is None or len(limits.known_scopes()) == _shared["count"]:
        return
    with _share_lock:
        scopes = limits.known_scopes()
        if len(scopes) == _shared["count"]:
            return
        target = directory / f"{SCOPES_PREFIX}{os.getpid()}.json"
        partial = target.with_suffix(".part")
        try:
            partial.write_text(json.dumps([dataclasses.asdict(scope) for scope in scopes]))
            partial.replace(target)  # a scrape never reads half a file
        except OSError as exc:
            log.warning("could not list this process's provider scopes for the metrics: %s", exc)
            return
        _shared["count"] = len(scopes)


def shared_scopes(directory: Path) -> list[limits.Scope]:
    """Every scope the service's processes listed (`share_scopes`), each once."""
    found: dict[str, limits.Scope] = {}
    for path in sorted(directory.glob(f"{SCOPES_PREFIX}*.json")):
        try:
            entries = json.loads(path.read_text())
            for entry in entries:
                scope = limits.Scope(**entry)
                found.setdefault(scope.key, scope)
        except (OSError, ValueError, TypeError) as exc:
            log.debug("skipped the scopes in %s: %s", path, exc)
    return list(found.values())

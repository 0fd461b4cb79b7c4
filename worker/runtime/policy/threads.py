"""The workers' threads as a shared limit: tenants share them by weight when they are the bottleneck.

Without a model limit, what holds batch turns back is the fleet's threads, and `chatq.batch` is
one FIFO list: a tenant that floods it with 3,000 turns would make another's 300, sent later, wait
behind all of them. So the threads are a scope of `worker.runtime.policy.limits` like a model's
(`threads@fleet`, metric label `threads`), whose `max_concurrent` is the fleet's thread count T:

- each `chatq worker` process registers its thread count in the hash `chatq:fleet:threads` (field
  its node name, value `threads expiry_ms`), refreshed by its due timer every CHATQ_DUE_INTERVAL
  (`refresh_fleet_threads`, a due step) and removed when it stops; T is the sum of the entries
  that have not expired (`live_threads`), read in the same round trip and kept in the process;
- a batch turn of a session with a tenant takes a slot in the scope before its model's (`admit`),
  with its tenant and weight (`CHATQ_TENANT_WEIGHTS`), and gives it back when it ends (`finish`).
  The scope never refuses for concurrency (the threads hold it themselves: `Scope.pool`); it
  shares: a tenant ahead of its weighted share while another tenant is backlogged yields
  (`fair_share`) and is put back like a turn waiting for a model slot, spaced in its tenant's
  line at T / (average batch turn time) split by weight. Tenants whose turns wait in the list,
  not taken yet, count as backlogged (`worker.tenant_queue`), so the flood moves aside;
- interactive turns and turns of sessions without a tenant skip the scope entirely: not one Redis
  call more (the lean turn pays nothing for it), and tenants' turns do not yield to them. One
  tenant alone, or none, runs as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from chatq.masking import mask_secrets
from chatq.tenant_weights import NO_TENANT
from worker.payload import BATCH_QUEUE
from worker.runtime.policy import limits
from worker.storable import is_outage

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime
    from worker.store.claims import Claim

__all__ = [
    "FLEET_KEY",
    "THREADS_MODEL",
    "Pool",
    "PoolSlot",
    "admit",
    "finish",
    "fleet_threads",
    "give_back",
    "join_fleet",
    "leave_fleet",
    "live_threads",
    "read_fleet",
    "refresh_fleet_threads",
    "register",
    "threads_scope",
]

log = logging.getLogger(__name__)

FLEET_KEY = "chatq:fleet:threads"
"""Hash of node name -> `threads expiry_ms`: each live worker process's thread pool."""
THREADS_MODEL = "threads"
"""The scope's label in metrics, `retry` events and `chatq usage`."""
MIN_ENTRY_SECONDS = 5.0
"""An entry outlives its last refresh by at least this (three due rounds when they are longer): a
killed worker's threads leave the count by then."""
SLOT_MARGIN = 10.0
"""Seconds a slot outlives the turn timeout (as a model's): a killed worker's slots come back after that."""


@dataclass(frozen=True, kw_only=True)
class Pool:
    """This worker process's threads, as it registers them."""

    node: str
    """Its Celery node name (unique on its host: `worker.cli.node_names`)."""
    threads: int
    """Its thread pool's size (`--concurrency`, CHATQ_WORKER_CONCURRENCY by default)."""


@dataclass(frozen=True, kw_only=True)
class PoolSlot:
    """A batch turn's answer from the threads scope."""

    scope: limits.Scope
    """The scope as it was asked (its `max_concurrent` the fleet's threads then)."""
    grant: limits.Grant
    """The limiter's answer."""
    tenant: str
    """The turn's tenant."""
    weight: float
    """Its weight (`CHATQ_TENANT_WEIGHTS`)."""
    started: float
    """`time.monotonic()` when it was asked."""


_pool: list[Pool] = []
"""This process's pool once the worker is ready (none in a producer or a test harness)."""
_fleet: list[int] = [0]
"""The fleet's threads as this process last read them (0: unknown, the scope is not used)."""


def live_threads(entries: Mapping[bytes | str, bytes | str], now_ms: int) -> tuple[int, list[str]]:
    """The threads of the entries not expired at `now_ms`, and the names of those that have."""
    total, expired = 0, []
    for raw_name, raw_value in entries.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        value = raw_value.decode() if isinstance(raw_value, bytes) else str(raw_value)
        threads, _, until = value.partition(" ")
        try:
            alive = int(until) > now_ms
            count = max(int(threads), 0)
        except ValueError:
            alive, count = False, 0
        if alive:
            total += count
        else:
            expired.append(name)
    return total, expired


def register(client: redis.Redis, pool: Pool | None, *, ttl: float) -> int:
    """Refresh `pool`'s entry (None: only read) for `ttl` seconds; returns the fleet's live threads.

    Expired entries (a killed worker's) are removed on the way. One round trip, on Redis's clock."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    pipe = client.pipeline(transaction=False)
    if pool is not None:
        pipe.hset(FLEET_KEY, pool.node, f"{pool.threads} {now_ms + int(ttl * 1000)}")
    pipe.hgetall(FLEET_KEY)
    entries = pipe.execute()[-1]
    total, expired = live_threads(entries, now_ms)
    if expired:
        client.hdel(FLEET_KEY, *expired)
    return total


def read_fleet(client: redis.Redis) -> int:
    """The fleet's live threads now (no entry of this process's)."""
    return register(client, None, ttl=0)


def join_fleet(node: str, threads: int) -> None:
    """Note this worker process's pool (at worker start); the due step registers it."""
    _pool[:] = [Pool(node=node, threads=max(int(threads), 0))]


def leave_fleet(client: redis.Redis) -> None:
    """Remove this process's entry (a warm stop), so the others stop counting its threads at once."""
    for pool in _pool:
        try:
            client.hdel(FLEET_KEY, pool.node)
        except Exception as exc:  # it expires by itself
            log.debug("could not remove this worker's threads from the fleet: %s", exc)
    _pool.clear()
    _fleet[0] = 0


def refresh_fleet_threads(runtime: Runtime) -> int:
    """The due step: refresh this process's entry and read the fleet's threads (0 things fired)."""
    if not _pool:
        return 0
    ttl = max(MIN_ENTRY_SECONDS, 3 * runtime.settings.due_interval)
    _fleet[0] = register(runtime.redis, _pool[0], ttl=ttl)
    return 0


def fleet_threads() -> int:
    """The fleet's threads as this process last read them (0: not known, not a worker)."""
    return _fleet[0]


def threads_scope(threads: int) -> limits.Scope:
    """The scope of the fleet's `threads`."""
    return limits.Scope(key=limits.THREADS_SCOPE_KEY, model=THREADS_MODEL, max_concurrent=threads, pool=True)


def admit(claim: Claim, *, runtime: Runtime) -> PoolSlot | None:
    """Take a thread slot for a tenant's batch turn, or learn that it yields; None: the scope does not apply.

    Interactive turns, sessions without a tenant, a process that knows no fleet (not a worker, or
    before its first due round) and a fleet with CHATQ_THREAD_SHARE off make no call at all."""
    tenant = claim.session.tenant
    threads = _fleet[0]
    if claim.queue != BATCH_QUEUE or not tenant or threads <= 0 or not runtime.settings.thread_share:
        return None
    scope = threads_scope(threads)
    weight = runtime.settings.tenant_weights.weight_of(tenant)
    try:
        grant = limits.acquire(
            runtime.redis,
            scope,
            str(claim.turn_id),
            interactive=False,
            hint_tokens=1,
            lease_seconds=runtime.settings.turn_timeout + SLOT_MARGIN,
            tenant=tenant,
            weight=weight,
            weights=_encoded(runtime),
        )
    except Exception as exc:
        if is_outage(exc):
            raise  # Redis is down: the delivery is retried as for any outage
        log.warning("turn %s: the threads' fair share failed, running without it: %s", claim.turn_id, exc)
        return None
    return PoolSlot(scope=scope, grant=grant, tenant=tenant, weight=weight, started=time.monotonic())


_weights: dict[int, tuple[object, str]] = {}


def _encoded(runtime: Runtime) -> str:
    """The process's weights as the script takes them (encoded once per settings object)."""
    table = runtime.settings.tenant_weights
    cached = _weights.get(0)
    if cached is None or cached[0] is not table:
        cached = (table, limits.encode_weights(table))
        _weights[0] = cached
    return cached[1]


def finish(slot: PoolSlot, claim: Claim, *, succeeded: bool, runtime: Runtime) -> None:
    """Give the slot back when the turn ended; a success teaches the scope how long a turn takes."""
    if not slot.grant.granted:
        return
    try:
        limits.release(
            runtime.redis,
            slot.scope,
            str(claim.turn_id),
            succeeded=succeeded,
            seconds=time.monotonic() - slot.started,
            estimate=slot.grant.estimate,
            tokens=0,
        )
    except Exception as exc:
        log.warning("turn %s: could not release its thread slot (it lapses): %s", claim.turn_id, mask_secrets(str(exc)))


def give_back(slot: PoolSlot, claim: Claim, *, runtime: Runtime) -> None:
    """The turn got its thread but waits for its model after all: undo the grant, so only turns that
    ran count against their tenant's share."""
    if not slot.grant.granted:
        return
    try:
        member = str(claim.turn_id)
        limits.give_back(runtime.redis, slot.scope, member, tenant=slot.tenant or NO_TENANT, weight=slot.weight)
    except Exception as exc:
        log.warning("turn %s: could not give its thread slot back: %s", claim.turn_id, mask_secrets(str(exc)))

"""Limits on what the whole fleet sends a model, kept in Redis and changed only by atomic scripts.

Per model (at its base URL) one hash holds the state every worker shares:

- **request and token rates** as GCRA token buckets (`r_tat` / `t_tat`, theoretical arrival
  times in ms): a request may go when the bucket has room, with a burst of `BURST_MS` worth;
- **a concurrency semaphore** with leases: a sorted set of the turns holding a slot, scored by
  when the slot lapses, so a killed worker's slots come back by themselves;
- **the adaptive limit** (`a_rpm`, `a_tpm`, `a_conc`): without configuration nothing is paced
  until the service answers 429; then the rate goes to 95% of the limit the service reports in
  `x-ratelimit-limit-*` (read per minute, as OpenAI means it), or without one drops by `BETA`
  from the rate the fleet really sent; each success raises it a little (additive increase),
  capped at what the service reported;
- **the hold** (`hold`): a 429 says when the service takes requests again (`Retry-After`, the
  reset of a spent window), and every sender waits until then instead of trickling into a spent
  window. Nothing is lowered from a refusal of a request sent before the hold, nor from a rate
  measured over time the fleet spent holding back (the collapse against a windowed provider);
- **the waiting lines**: a turn that cannot go is told when to come back, and batch turns are
  spaced one interval apart, so a backlog of thousands comes back at the rate it can run instead
  of polling; a waiting interactive turn holds every batch turn back until it ran. Each tenant
  has its own line (`:shares`, `n:<tenant>`), spaced so that the lines of the backlogged tenants
  (`:backlogged`, scored by when each line ends) come back together at the limit's rate, each
  at its weight's part of it among the lines still running at that point: a turn placed beyond
  the others' backlog is spaced for the whole rate, so a line is dense again once they are done;
- **fair share**, within each class (batch turns among batch turns, interactive among
  interactive, each tenant's interactive line and virtual time prefixed `i`): each grant moves its
  tenant's virtual time on by 1/weight, and a turn of
  a tenant ahead of another backlogged tenant yields the free slot to it (`fair_share`), so the
  tenants waiting for a limit get its capacity in proportion to their weights
  (`CHATQ_TENANT_WEIGHTS`), whatever order their turns came in. A tenant with nothing waiting has
  no share and banks no credit;
  Interactive turns waiting for a concurrency slot are told when the slot their place in line
  gets should free (from when the holders started and how long a request takes), so each comes
  back about once instead of once a second.

The clock is Redis's (`TIME`), shared by every host. No Celery here; `worker.runtime.policy.provider`
decides what a turn does with an answer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import redis

from chatq.tenant_weights import ANY_TENANT, NO_TENANT, TenantWeights
from worker.payload import BATCH_QUEUE
from worker.runtime.policy.limit_scripts import ACQUIRE, GIVE_BACK, RELEASE, THROTTLED
from worker.tenant_queue import QUEUE_SLACK, QUEUED_KEY, QUIET_MS

__all__ = [
    "BETA",
    "BURST_MS",
    "THREADS_SCOPE_KEY",
    "Grant",
    "LimitState",
    "Scope",
    "TenantShare",
    "acquire",
    "encode_weights",
    "give_back",
    "held_back",
    "known_scopes",
    "mark_held",
    "release",
    "shares",
    "slots_by_tenant",
    "state",
    "throttled",
]

BURST_MS = 500
"""Tolerance of the rate buckets: at most half a second's worth of requests leave together."""
BETA = 0.85
"""Multiplicative decrease of the adaptive limit on a 429 the service gave no limit for."""
THREADS_SCOPE_KEY = "threads@fleet"
"""The workers' threads' scope (`worker.runtime.policy.threads`): not a model's, so not in `slots_by_tenant`."""
HELD_KEY = "chatq:limits:held"
"""Hash of model -> JSON `{"reason", "until"}`: which models are holding turns back now (`chatq batch`)."""


@dataclass(frozen=True, kw_only=True)
class Scope:
    """One model at one base URL, as the limits see it."""

    key: str
    """The Redis name of the scope: `MODEL@BASE_URL`."""
    model: str
    """The model name (metric label)."""
    rpm: float = 0.0
    """Configured requests per minute (0: none)."""
    tpm: float = 0.0
    """Configured tokens per minute (0: none)."""
    max_concurrent: int = 0
    """Configured requests in flight (0: none)."""
    pool: bool = False
    """The scope is the workers' threads (`worker.runtime.policy.threads`): `max_concurrent` is the
    fleet's thread count, which the threads hold by themselves, so it paces and shares but never
    refuses for concurrency; and tenants whose batch turns wait in `chatq.batch`, not taken yet
    (`worker.tenant_queue`), count as backlogged."""

    def keys(self) -> tuple[str, str, str, str]:
        """Its state hash, slot set, interactive waiters and sent log."""
        base = f"chatq:limits:{self.key}"
        return base, f"{base}:slots", f"{base}:iwait", f"{base}:sent"

    def share_keys(self) -> tuple[str, str]:
        """Its tenants' shares (virtual times, weights, lines, counts) and the set of backlogged tenants."""
        base = f"chatq:limits:{self.key}"
        return f"{base}:shares", f"{base}:backlogged"


@dataclass(frozen=True, kw_only=True)
class Grant:
    """The answer to `acquire`."""

    granted: bool
    """True: the turn holds a slot now and may call the model."""
    wait: float
    """When not granted: seconds until the turn should ask again."""
    reason: str
    """When not granted: `concurrency`, `rpm`, `tpm`, `interactive` (an interactive turn goes first),
    `fair_share` (the turn's tenant had more than its weighted share while others wait) or
    `rate_limited` (the fleet waits out the service's last 429)."""
    in_flight: int
    """Slots held in the scope (this one included when granted)."""
    estimate: int
    """Tokens charged for the request before it ran (corrected by `release`)."""


@dataclass(frozen=True, kw_only=True)
class LimitState:
    """What the fleet allows a scope now (metrics)."""

    rpm: float
    """Requests per minute allowed now (0: unlimited)."""
    tpm: float
    """Tokens per minute allowed now (0: unlimited)."""
    max_concurrent: float
    """Requests in flight allowed now (0: unlimited)."""
    in_flight: int
    """Slots held now."""


@dataclass(frozen=True, kw_only=True)
class TenantShare:
    """What one tenant received of a scope's capacity (metrics, `chatq usage`)."""

    tenant: str
    """The tenant (`chatq.tenant_weights.NO_TENANT` for sessions without one)."""
    weight: float
    """Its weight when its turns last asked."""
    granted: int
    """Slots its turns were given in the scope since the scope's state was last idle for a day."""
    yielded: int
    """Times one of its turns gave a free slot to a tenant behind its share (in the same class)."""
    backlogged: bool
    """Whether its turns (batch or interactive) wait in line for the scope now."""


_scripts: dict[str, Any] = {}
_seen: dict[str, Scope] = {}
"""Scopes this process asked about (the metrics read their state at scrape time)."""


def known_scopes() -> list[Scope]:
    """The scopes this process has sent turns under."""
    return list(_seen.values())


def _script(client: redis.Redis, name: str, source: str) -> Any:
    cached = _scripts.get(name)
    if cached is None or cached[0] is not client:
        cached = (client, client.register_script(source))
        _scripts[name] = cached
    return cached[1]


def acquire(
    client: redis.Redis,
    scope: Scope,
    member: str,
    *,
    interactive: bool,
    hint_tokens: int,
    lease_seconds: float,
    tenant: str = NO_TENANT,
    weight: float = 1.0,
    weights: str = "",
) -> Grant:
    """Take a slot for `member` (a turn id) if the scope's limits allow it now, else say when to ask again.

    A batch turn's `tenant` and its `weight` (`CHATQ_TENANT_WEIGHTS`) decide its share while other
    tenants' turns wait for the same limit. `weights` (`tenant=w,...,*=w`, `encode_weights`): every
    tenant's, for those the scope has not heard from yet (a pool's tenants waiting in the queue)."""
    _seen[scope.key] = scope  # the newest (a pool's thread count changes)
    queue = [QUEUED_KEY, BATCH_QUEUE] if scope.pool else []
    reply = _script(client, "acquire", ACQUIRE)(
        keys=[*scope.keys(), *scope.share_keys(), *queue],
        args=[
            member,
            "1" if interactive else "0",
            scope.rpm,
            scope.tpm,
            scope.max_concurrent,
            max(int(hint_tokens), 1),
            int(lease_seconds * 1000),
            BURST_MS,
            tenant or NO_TENANT,
            weight,
            "1" if scope.pool else "0",
            QUEUE_SLACK,
            weights,
            QUIET_MS,
        ],
    )
    granted, wait_ms, reason, in_flight, estimate = reply
    return Grant(
        granted=bool(int(granted)),
        wait=int(wait_ms) / 1000.0,
        reason=reason.decode() if isinstance(reason, bytes) else str(reason),
        in_flight=int(in_flight),
        estimate=int(estimate),
    )


def encode_weights(weights: TenantWeights) -> str:
    """`CHATQ_TENANT_WEIGHTS` as `acquire` passes it to the script."""
    named = [f"{tenant}={weight!r}" for tenant, weight in weights.weights]
    return ",".join([*named, f"{ANY_TENANT}={weights.default!r}"])


def release(
    client: redis.Redis, scope: Scope, member: str, *, succeeded: bool, seconds: float, estimate: int, tokens: int
) -> None:
    """Give the slot back; a success corrects the token charge and raises the adaptive limits a little."""
    hash_key, slots, _, sent = scope.keys()
    _script(client, "release", RELEASE)(
        keys=[hash_key, slots, sent],
        args=[member, "ok" if succeeded else "other", int(seconds * 1000), estimate, max(tokens, 0), scope.tpm],
    )


def give_back(client: redis.Redis, scope: Scope, member: str, *, tenant: str, weight: float) -> None:
    """Give back a slot the turn did not use (it could not run after all): its grant and virtual time are undone."""
    _, slots, _, _ = scope.keys()
    share_hash, _ = scope.share_keys()
    _script(client, "give_back", GIVE_BACK)(keys=[slots, share_hash], args=[member, tenant or NO_TENANT, weight])


def throttled(
    client: redis.Redis,
    scope: Scope,
    *,
    kind: str,
    limit_requests: float | None,
    limit_tokens: float | None,
    retry_after: float | None = None,
) -> LimitState:
    """The service refused a request (`rate_limited` or `overloaded`): adapt the limits; a 429's
    `retry_after` (seconds) holds every sender of the scope back until then."""
    hash_key, slots, _, sent = scope.keys()
    wait_ms = int(max(retry_after or 0.0, 0.0) * 1000)
    a_rpm, a_tpm, a_conc = _script(client, "throttled", THROTTLED)(
        keys=[hash_key, slots, sent], args=[kind, limit_requests or 0, limit_tokens or 0, BETA, wait_ms]
    )
    return LimitState(
        rpm=_effective(scope.rpm, float(a_rpm)),
        tpm=_effective(scope.tpm, float(a_tpm)),
        max_concurrent=_effective(float(scope.max_concurrent), float(a_conc)),
        in_flight=0,
    )


def state(client: redis.Redis, scope: Scope) -> LimitState:
    """The scope's limits now: configured and adaptive combined."""
    hash_key, slots, _, _ = scope.keys()
    pipe = client.pipeline(transaction=False)
    pipe.hmget(hash_key, ["a_rpm", "a_tpm", "a_conc"])
    pipe.zcard(slots)
    (a_rpm, a_tpm, a_conc), held = pipe.execute()
    return LimitState(
        rpm=_effective(scope.rpm, float(a_rpm or 0)),
        tpm=_effective(scope.tpm, float(a_tpm or 0)),
        max_concurrent=_effective(float(scope.max_concurrent), math.floor(float(a_conc or 0))),
        in_flight=int(held),
    )


def shares(client: redis.Redis, scope: Scope) -> list[TenantShare]:
    """Each tenant's share of the scope so far, by tenant name."""
    share_hash, backlogged = scope.share_keys()
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(share_hash)
    pipe.zrange(backlogged, 0, -1, withscores=True)
    pipe.time()
    fields, lines, (seconds, micros) = pipe.execute()
    now_ms = seconds * 1000 + micros // 1000
    # A tenant's interactive line is `i:<tenant>` beside its batch line `<tenant>`.
    waiting = {_text(name).removeprefix("i:") for name, until in lines if until > now_ms}
    values = {_text(key): _text(value) for key, value in fields.items()}
    tenants = sorted({key.split(":", 1)[1] for key in values if key[:2] in ("g:", "w:")})
    return [
        TenantShare(
            tenant=tenant,
            weight=float(values.get(f"w:{tenant}", 1)),
            granted=int(values.get(f"g:{tenant}", 0)),
            yielded=int(values.get(f"d:{tenant}", 0)),
            backlogged=tenant in waiting,
        )
        for tenant in tenants
    ]


def slots_by_tenant(client: redis.Redis) -> dict[str, int]:
    """Slots each tenant's turns were given under every model's limits kept in Redis now (`chatq usage`).

    Not the workers' threads' (every batch turn of a tenant takes one there: counted beside a
    model's slot, a turn would count twice; the metrics show them under `threads`)."""
    totals: dict[str, int] = {}
    threads = f"chatq:limits:{THREADS_SCOPE_KEY}:shares"
    for key in client.scan_iter(match="chatq:limits:*:shares", count=500):
        if _text(key) == threads:
            continue
        for field, value in (client.hgetall(key) or {}).items():
            name = _text(field)
            if name.startswith("g:"):
                totals[name[2:]] = totals.get(name[2:], 0) + int(value)
    return totals


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _effective(configured: float, adaptive: float) -> float:
    if configured > 0 and adaptive > 0:
        return min(configured, adaptive)
    return max(configured, adaptive)


def mark_held(client: redis.Redis, model: str, reason: str, until: float) -> None:
    """Note that turns of `model` are held back until Unix time `until` (read by `held_back`)."""
    client.hset(HELD_KEY, model, json.dumps({"reason": reason, "until": round(until, 3)}))


def held_back(client: redis.Redis, now: float) -> dict[str, dict[str, Any]]:
    """Models whose turns are held back at Unix time `now`: model -> `{"reason", "until"}`."""
    found: dict[str, dict[str, Any]] = {}
    for model, raw in (client.hgetall(HELD_KEY) or {}).items():
        try:
            entry = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if isinstance(entry, dict) and float(entry.get("until") or 0) > now:
            found[model.decode() if isinstance(model, bytes) else str(model)] = entry
    return found

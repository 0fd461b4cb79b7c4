"""A turn and the model service: its slot under the shared limits, and waiting out the service's refusals.

The runner asks `admit` before an attempt starts: a turn whose model has no slot free is put back
to wait (`claims.hold_turn`, its attempt given back) and sent again when the limiter says, so it
holds no worker thread while it waits. A `handlers.errors.ProviderBusy` before the first text
(`on_busy`) adapts the model's limits (a 429 also holds every other turn of the model until the
service's reset) and puts the turn back likewise, after the wait the service asked for plus
jitter, until `CHATQ_PROVIDER_PATIENCE` runs out. Consumers get a
`retry` event with `waiting` (why, and until when) each time.

With `CHATQ_PROVIDER_LIMITS=off` none of this runs: a refusal is an ordinary agent failure.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from chatq.masking import mask_secrets
from chatq.model_limits import limit_for
from chatq.settings import ECHO_MODEL, Settings
from chatq.tenant_weights import NO_TENANT
from handlers.errors import ProviderBusy
from handlers.tokens import count_tokens
from worker.events import EventType, TurnEvents
from worker.payload import INTERACTIVE_QUEUE
from worker.runtime.observers import hook_points, hooks
from worker.runtime.observers.hooks import Facts
from worker.runtime.policy import limits, threads
from worker.runtime.policy.retry import RetryDecision
from worker.storable import is_outage
from worker.store import claims

if TYPE_CHECKING:
    from worker.runtime.delivery.process import Runtime

__all__ = ["Admission", "admit", "finish", "hold", "on_busy", "scope_of"]

log = logging.getLogger(__name__)

CONFIGURED_SHARE = 0.97
"""Share of a configured rate the fleet paces itself to: the provider counts requests when they
arrive, and the jitter between a slot being granted and its request arriving would otherwise
cost a 429 each time two requests land closer together than the provider's refill allows."""
SLOT_MARGIN = 10.0
"""Seconds a slot outlives the turn timeout: a killed worker's slots come back after that."""
REPLY_TOKENS = 256
"""Tokens a reply is guessed at before a model has any history of its own."""

_REASONS = {
    "concurrency": "all of the model's concurrent slots are in use",
    "rpm": "the model's request rate limit is reached",
    "tpm": "the model's token rate limit is reached",
    "interactive": "an interactive turn goes first",
    "fair_share": "the tenant has had its share of the model's capacity while other tenants wait",
    "fair_share:threads": "the tenant has had its share of the workers' threads while other tenants wait",
    "rate_limited": "the model service is rate limiting requests (HTTP 429)",
    "overloaded": "the model service is overloaded",
    "unreachable": "the model service cannot be reached",
    "timeout": "the model service did not answer in time",
}


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A turn's slot, or why it has none."""

    scope: limits.Scope | None
    """The model's limits (None: not limited, e.g. the offline `echo` model or limits off)."""
    grant: limits.Grant | None
    """The limiter's answer (None when not limited)."""
    started: float
    """`time.monotonic()` when the slot was taken."""
    pool: threads.PoolSlot | None = None
    """The thread slot a tenant's batch turn holds beside its model's (`worker.runtime.policy.threads`)."""

    @property
    def waiting(self) -> bool:
        """True: no slot now; `hold` puts the turn back."""
        return self.grant is not None and not self.grant.granted


def scope_of(claim: claims.Claim, settings: Settings) -> limits.Scope | None:
    """The limits the turn's model runs under (None: none apply)."""
    model = settings.session_model(claim.session.model)
    if not settings.provider_limits or model == ECHO_MODEL or claim.session.agent_framework not in _OPENAI:
        return None
    base = (settings.openai_base_url or "https://api.openai.com/v1").rstrip("/")
    entry = limit_for(settings.model_limits, model, base)
    return limits.Scope(
        key=f"{model}@{base}",
        model=model,
        rpm=(entry.rpm or 0.0) * CONFIGURED_SHARE if entry else 0.0,
        tpm=(entry.tpm or 0.0) * CONFIGURED_SHARE if entry else 0.0,
        max_concurrent=(entry.max_concurrent or 0) if entry else 0,
    )


# The frameworks whose requests go to the OpenAI-compatible service (a plugin's may not).
_OPENAI = frozenset({"langgraph", "none", "plain_openai"})


def admit(claim: claims.Claim, *, runtime: Runtime) -> Admission:
    """Take a slot for the claimed turn under the workers' threads (a tenant's batch turn,
    `worker.runtime.policy.threads`), then under its model's limits (or learn that it must wait)."""
    pool = threads.admit(claim, runtime=runtime)
    if pool is None:
        return _admit_model(claim, runtime)
    if not pool.grant.granted:
        return Admission(scope=pool.scope, grant=pool.grant, started=pool.started)
    try:
        admission = _admit_model(claim, runtime)
    except Exception:
        threads.give_back(pool, claim, runtime=runtime)
        raise
    if admission.waiting:
        # It waits for its model after all: the thread it was given is not used, nor counted.
        threads.give_back(pool, claim, runtime=runtime)
        return admission
    return replace(admission, pool=pool)


def _admit_model(claim: claims.Claim, runtime: Runtime) -> Admission:
    scope = scope_of(claim, runtime.settings)
    if scope is None:
        return Admission(scope=None, grant=None, started=time.monotonic())
    try:
        grant = limits.acquire(
            runtime.redis,
            scope,
            str(claim.turn_id),
            interactive=claim.queue == INTERACTIVE_QUEUE,
            hint_tokens=count_tokens(claim.content) + REPLY_TOKENS,
            lease_seconds=runtime.settings.turn_timeout + SLOT_MARGIN,
            tenant=claim.session.tenant or NO_TENANT,
            weight=runtime.settings.tenant_weights.weight_of(claim.session.tenant),
        )
    except Exception as exc:
        if is_outage(exc):
            raise  # Redis is down: the delivery is retried as for any outage
        # A limiter that fails for another reason must not stop every turn of the model.
        log.warning("turn %s: the shared limits failed, running without them: %s", claim.turn_id, exc)
        return Admission(scope=None, grant=None, started=time.monotonic())
    if grant.granted:
        runtime.hooks.provider_admitted(hook_points.ProviderAdmitted(model=scope.model))
    return Admission(scope=scope, grant=grant, started=time.monotonic())


def finish(admission: Admission, claim: claims.Claim, *, succeeded: bool, tokens: int, runtime: Runtime) -> None:
    """Give the slots back (best effort: they lapse on their own otherwise)."""
    if admission.pool is not None:
        threads.finish(admission.pool, claim, succeeded=succeeded, runtime=runtime)
    if admission.scope is None or admission.grant is None or not admission.grant.granted:
        return
    try:
        limits.release(
            runtime.redis,
            admission.scope,
            str(claim.turn_id),
            succeeded=succeeded,
            seconds=time.monotonic() - admission.started,
            estimate=admission.grant.estimate,
            tokens=tokens,
        )
        if succeeded:
            runtime.redis.delete(_busy_key(claim))
    except Exception as exc:
        log.warning("turn %s: could not release its slot (it lapses): %s", claim.turn_id, mask_secrets(str(exc)))


def hold(claim: claims.Claim, admission: Admission, *, runtime: Runtime) -> RetryDecision | None:
    """Put a turn without a slot back until the limiter's time; None if the turn was not ours any more."""
    assert admission.grant is not None and admission.scope is not None
    decision = runtime.retry.when_no_slot(admission.grant.wait)
    if not claims.hold_turn(claim, engine=runtime.engine, seconds=decision.delay):
        return None
    runtime.hooks.slot_wait(
        hook_points.SlotWait(model=admission.scope.model, reason=admission.grant.reason, seconds=decision.delay)
    )
    _announce(
        claim, admission.scope.model, admission.grant.reason, decision, attempt=claim.attempt - 1, runtime=runtime
    )
    return decision


def on_busy(claim: claims.Claim, events: TurnEvents, exc: ProviderBusy, *, runtime: Runtime) -> RetryDecision | None:
    """The service refused the turn before its first text: adapt the limits, then wait or give up.

    Returns the decision (`retry` False: patience ran out, the caller fails the turn), or None when
    the turn was not ours any more.
    """
    scope = scope_of(claim, runtime.settings)
    model = scope.model if scope else runtime.settings.session_model(claim.session.model)
    runtime.hooks.provider_refused(hook_points.ProviderRefused(model=model, status=str(exc.status or exc.reason)))
    if scope is not None and exc.reason in ("rate_limited", "overloaded"):
        try:
            limits.throttled(
                runtime.redis,
                scope,
                kind=exc.reason,
                limit_requests=exc.limit_requests,
                limit_tokens=exc.limit_tokens,
                retry_after=exc.retry_after,
            )
        except Exception as error:  # adapting is best effort; the wait below still happens
            log.warning("turn %s: could not lower the model's limits: %s", claim.turn_id, mask_secrets(str(error)))
    refusals, busy_for = _count_refusal(claim, runtime)
    decision = runtime.retry.when_provider_busy(
        exc.retry_after, refusals=refusals, busy_for=busy_for, jitter=random.random()
    )
    if not decision.retry:
        return decision
    if not claims.hold_turn(claim, engine=runtime.engine, seconds=decision.delay):
        return None
    _announce(
        claim, model, exc.reason, decision, attempt=claim.attempt, runtime=runtime, events=events, error=exc.message
    )
    return decision


def patience_error(exc: ProviderBusy, settings: Settings) -> str:
    """The turn's error when the service kept refusing it for CHATQ_PROVIDER_PATIENCE seconds."""
    patience = settings.provider_patience
    return f"{_REASONS.get(exc.reason, exc.message)}, and kept refusing for {patience:g} s (CHATQ_PROVIDER_PATIENCE)"


def _busy_key(claim: claims.Claim) -> str:
    return f"chatq:provider:busy:{claim.turn_id}"


def _count_refusal(claim: claims.Claim, runtime: Runtime) -> tuple[int, float]:
    """Count one more refusal of the turn; returns (refusals so far, seconds since the first)."""
    now = time.time()
    key = _busy_key(claim)
    pipe = runtime.redis.pipeline(transaction=True)
    pipe.hsetnx(key, "since", now)
    pipe.hincrby(key, "refusals", 1)
    pipe.hget(key, "since")
    pipe.expire(key, int(runtime.settings.provider_patience) + 3600)
    _, refusals, since, _ = pipe.execute()
    return int(refusals), max(now - float(since), 0.0)


def _announce(
    claim: claims.Claim,
    model: str,
    reason: str,
    decision: RetryDecision,
    *,
    attempt: int,
    runtime: Runtime,
    events: TurnEvents | None = None,
    error: str | None = None,
) -> None:
    """The `retry` event with `waiting`, the `retried` hook, and the note `chatq batch` shows."""
    until = time.time() + decision.delay
    why = _REASONS.get(f"{reason}:{model}", _REASONS.get(reason, reason))
    if events is None:
        events = TurnEvents.resume(
            session_id=claim.session.id,
            turn_id=claim.turn_id,
            client=runtime.redis,
            retention=runtime.settings.event_retention,
        )
    events.publish(
        EventType.RETRY,
        max(attempt, 0),
        error=f"{why}; trying again in {decision.delay:.1f} s",
        waiting={"reason": reason, "until": round(until, 3)},
    )
    try:
        if model != threads.THREADS_MODEL:  # the threads hold back no model (`chatq batch`'s note)
            limits.mark_held(runtime.redis, model, reason, until)
    except Exception as exc:
        log.debug("could not note the hold: %s", exc)
    runtime.hooks.retried(
        hooks.Retried(
            turn=Facts.of_claim(claim, runtime.settings),
            cause=decision.cause,
            delay=decision.delay,
            error=mask_secrets(error or why),
        )
    )

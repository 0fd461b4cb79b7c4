"""Running one delivery of a turn: claim, run the handler, persist, publish. No Celery in here.

`execute_turn` is what the `chatq.run_turn` task calls; it returns what happened so the task
can decide on a Celery retry, and it can be called and tested without a worker. The runner runs;
what observes a turn (metrics, the per-turn log lines) is a hook (`worker.runtime.observers.hooks`), called at each
point of its lifecycle, and whether and when a delivery is tried again is `worker.runtime.policy.retry`'s policy.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
import uuid
from dataclasses import dataclass

from chatq.masking import mask_secrets
from handlers.context import running_turn
from handlers.errors import (
    AgentInvocationError,
    AwaitingApproval,
    BudgetSpent,
    HandlerError,
    ProviderBusy,
    StepNotRecorded,
    UnknownFramework,
)
from handlers.messages import Usage
from models.tables import TurnStatus
from worker.budgets import BUDGET_EXCEEDED, Gate
from worker.dispatch import kick_next, send_next, send_turn
from worker.errors import ConfigError, HandBack, InvalidTurn, LeaseLost, SessionDeleted, TurnCancelled
from worker.events import EventType, TurnEvents
from worker.log_context import set_attempt, turn_context
from worker.payload import TurnRequest
from worker.runtime.delivery import budget_guard
from worker.runtime.delivery.paused import pause, report_waits
from worker.runtime.delivery.process import Runtime
from worker.runtime.delivery.relay import run_handler
from worker.runtime.delivery.resume import announced, open_journal, resuming
from worker.runtime.observers import hooks
from worker.runtime.observers.hooks import Facts
from worker.runtime.policy import provider
from worker.runtime.policy.retry import RetryDecision
from worker.runtime.recovery.leases import handing_back
from worker.storable import clean_text, is_outage, is_refusal, refusal_message
from worker.store import claims, turns

log = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    """What one delivery of a turn did."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY = "retry"
    SKIPPED = "skipped"
    BUSY = "busy"
    LOST = "lost"
    HANDED_BACK = "handed_back"
    WAITING = "waiting"
    PAUSED = "paused"
    """The turn waits for a person's decision on tool calls (`awaiting_approval`); the decision sends it again."""


@dataclass(frozen=True, kw_only=True)
class Result:
    """The outcome of `execute_turn`."""

    outcome: Outcome
    """What happened."""
    retry_after: float | None = None
    """For RETRY, BUSY and WAITING: seconds after which the task should be delivered again."""
    attempt: int = 0
    """The handler invocation this delivery ran (0 if none)."""
    error: str | None = None
    """For FAILED: why, as the turn stored or the rejection said it."""
    tokens: int = 0
    """For SUCCEEDED: the total tokens the model service reported (they correct the shared limits)."""


def execute_turn(request: TurnRequest, *, queue: str, worker: str, runtime: Runtime, stored: bool = True) -> Result:
    """Run one delivery of a turn end to end; outages (`worker.storable.is_outage`) propagate to the caller.

    Data Postgres refuses is never an outage: a claimed turn fails at once (`_run_claimed`), and a
    message refused before its claim is rejected here, with nothing stored. `stored=False`: the
    message did not come from chatq's producer (`worker.dispatch.STORED_HEADER`), so its turn is
    most likely not stored yet (`worker.store.claims.claim_message`).
    """
    with turn_context(turn_id=request.turn_id, session_id=request.session_id):
        try:
            return _execute(request, queue=queue, worker=worker, runtime=runtime, stored=stored)
        except Exception as exc:
            if not is_refusal(exc):
                raise
            error = refusal_message(exc, "the turn")
            reject(request.turn_id, request.session_id, error, runtime=runtime)
            return Result(outcome=Outcome.FAILED, error=error)


def _execute(request: TurnRequest, *, queue: str, worker: str, runtime: Runtime, stored: bool) -> Result:
    registry = runtime.hooks
    # The message's sent-marker was dropped on receipt (worker.ops.signals), before the pool ran this.
    registry.before_claim(
        hooks.Claiming(turn_id=request.turn_id, session_id=request.session_id, queue=queue, worker=worker)
    )
    if handing_back():
        # A message taken just as the worker began shutting down: pass it on untouched.
        send_turn(request.to_message(), queue=queue, client=runtime.redis)
        registry.handed_back(hooks.HandedBack(turn=Facts.of_request(request), running=False))
        return Result(outcome=Outcome.HANDED_BACK)
    try:
        # A raw producer's message (its turn not stored yet) is stored by the claim: one statement more.
        claimed = claims.claim_message(
            request, queue=queue, worker=worker, engine=runtime.engine, settings=runtime.settings, stored=stored
        )
    except SessionDeleted:
        # A message left in Redis by a session deleted since: nothing to run, nothing to publish.
        log.info("turn %s session %s: the session was deleted; message dropped", request.turn_id, request.session_id)
        return Result(outcome=Outcome.SKIPPED)
    except InvalidTurn as exc:
        reject(request.turn_id, request.session_id, exc.message, runtime=runtime)
        return Result(outcome=Outcome.FAILED, error=exc.message)
    status = claimed.status
    if status is claims.ClaimStatus.CONFLICT:
        # The turn belongs to another session: its own messages and events go on untouched, so
        # this message is refused with a log line only (its replay stream is the other turn's).
        registry.rejected(
            hooks.Rejected(turn_id=request.turn_id, session_id=request.session_id, error=claimed.error or "")
        )
        return Result(outcome=Outcome.FAILED, error=claimed.error)
    if status is claims.ClaimStatus.BUSY:
        decision = runtime.retry.when_busy(claimed.retry_after)
        registry.retried(hooks.Retried(turn=Facts.of_request(request), cause=decision.cause, delay=decision.delay))
        return Result(outcome=Outcome.BUSY, retry_after=decision.delay)
    if status in (claims.ClaimStatus.POISONED, claims.ClaimStatus.CANCELLED):
        events = _events(request.session_id, request.turn_id, runtime)
        facts = Facts.of_request(request, attempt=claimed.attempt)
        if status is claims.ClaimStatus.POISONED:
            events.publish(EventType.ERROR, claimed.attempt, error=claimed.error)
            registry.failed(hooks.Failed(turn=facts, error=claimed.error or "", at_claim=True))
            kick_next(request.session_id, engine=runtime.engine, client=runtime.redis)
            return Result(outcome=Outcome.FAILED, attempt=claimed.attempt, error=claimed.error)
        events.publish(EventType.CANCELLED, claimed.attempt)
        registry.cancelled(hooks.Cancelled(turn=facts, at_claim=True))
        kick_next(request.session_id, engine=runtime.engine, client=runtime.redis)
        return Result(outcome=Outcome.CANCELLED)
    if claimed.claim is None:
        log.debug("turn %s: nothing to claim (%s)", request.turn_id, status.value)
        return Result(outcome=Outcome.SKIPPED)
    if handing_back():
        # The shutdown began while this turn was being claimed: it goes back before it starts.
        return give_back_unstarted(claimed.claim, runtime=runtime)
    return run_admitted(claimed.claim, runtime=runtime)


def give_back_unstarted(claim: claims.Claim, *, runtime: Runtime) -> Result:
    """Requeue a claimed turn that has not started (no `started` event yet) and send it again."""
    if not claims.requeue_turn(claim, engine=runtime.engine, hand_back=True):
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    send_turn(claim.to_message(), queue=claim.queue, client=runtime.redis, tenant=claim.session.tenant)
    runtime.hooks.handed_back(hooks.HandedBack(turn=Facts.of_claim(claim, runtime.settings), running=False))
    return Result(outcome=Outcome.HANDED_BACK)


def run_admitted(claim: claims.Claim, *, runtime: Runtime) -> Result:
    """Run a claimed turn once its model's shared limits give it a slot (`worker.runtime.policy.provider`),
    else put it back to wait for one without holding this thread. Before that, its tenant's budget
    (`CHATQ_TENANT_BUDGETS`, `worker.runtime.delivery.budget_guard`): spent, the turn fails before
    any model request; near it, the turn waits while the tenant's other turns run."""
    try:
        budget = budget_guard.admit(claim, runtime)
    except Exception:
        # Redis unreachable: give the turn back now (else it waits for its lease to run out).
        with contextlib.suppress(Exception):
            claims.requeue_turn(claim, engine=runtime.engine, hand_back=True)
        raise
    if budget is None:
        return _run_provided(claim, runtime=runtime)
    gate, spend = budget
    if gate is Gate.REFUSE:
        events = _events(claim.session.id, claim.turn_id, runtime)
        return fail(claim, events, spend.reason(), runtime=runtime, reason=BUDGET_EXCEEDED)
    if gate is Gate.WAIT:
        waited = budget_guard.hold(claim, spend, runtime=runtime)
        if waited is None:
            return Result(outcome=Outcome.LOST, attempt=claim.attempt)
        return Result(outcome=Outcome.WAITING, retry_after=waited.delay)
    try:
        return _run_provided(claim, runtime=runtime)
    finally:
        budget_guard.release(claim, runtime)


def _run_provided(claim: claims.Claim, *, runtime: Runtime) -> Result:
    try:
        admission = provider.admit(claim, runtime=runtime)
    except Exception:
        # Redis unreachable: give the turn back now (else it waits for its lease to run out).
        with contextlib.suppress(Exception):
            claims.requeue_turn(claim, engine=runtime.engine, hand_back=True)
        raise
    if admission.waiting:
        decision = provider.hold(claim, admission, runtime=runtime)
        if decision is None:
            return Result(outcome=Outcome.LOST, attempt=claim.attempt)
        return Result(outcome=Outcome.WAITING, retry_after=decision.delay)
    result: Result | None = None
    try:
        result = run_claimed(claim, runtime=runtime)
        return result
    finally:
        succeeded = result is not None and result.outcome is Outcome.SUCCEEDED
        provider.finish(admission, claim, succeeded=succeeded, tokens=result.tokens if result else 0, runtime=runtime)


def run_claimed(claim: claims.Claim, *, runtime: Runtime) -> Result:
    """Run the handler for a claimed turn and record how it ended (`started` ... `ended` hooks)."""
    set_attempt(claim.attempt)
    started = time.monotonic()
    facts = Facts.of_claim(claim, runtime.settings)
    registry = runtime.hooks
    registry.started(hooks.Started(turn=facts, deliveries=claim.deliveries))
    outcome, error = "raised", None
    try:
        result = _run_claimed(claim, started, runtime)
        outcome, error = result.outcome.value, result.error
        return result
    finally:
        registry.ended(hooks.Ended(turn=facts, outcome=outcome, seconds=time.monotonic() - started, error=error))


def retry_after_outage(request: TurnRequest, exc: BaseException, retries: int, *, runtime: Runtime) -> RetryDecision:
    """The policy's answer to an outage (`worker.storable.is_outage`) in the `retries`-th re-delivery."""
    decision = runtime.retry.after_outage(retries)
    error = mask_secrets(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
    runtime.hooks.retried(
        hooks.Retried(turn=Facts.of_request(request), cause=decision.cause, delay=decision.delay, error=error)
    )
    return decision


def _run_claimed(claim: claims.Claim, started: float, runtime: Runtime) -> Result:
    registry = runtime.hooks
    journal = open_journal(claim, runtime)
    check = budget_guard.step_check(claim, runtime)
    if check is not None:
        journal.watch(check)  # the tenant's budget, after each finished step
    report_waits(claim, journal, runtime=runtime)
    if claim.deliveries > 1:
        events = _events(claim.session.id, claim.turn_id, runtime)
        # The previous delivery ended without a clean hand-back (its worker died or lost its
        # lease) after publishing partial text: tell consumers to drop it, as for any retry
        # (all but its finished steps, which this attempt continues after).
        events.publish(EventType.RETRY, claim.attempt - 1, **resuming("the previous worker stopped", journal))
        events.publish(EventType.STARTED, claim.attempt)
    else:
        # The usual case: number `started` after the stream's newest event and publish it in one
        # round trip, on the path from the message's arrival to the user's first sign of life.
        events = TurnEvents.resume_with(
            EventType.STARTED,
            claim.attempt,
            session_id=claim.session.id,
            turn_id=claim.turn_id,
            client=runtime.redis,
            retention=runtime.settings.event_retention,
        )
    keeper = runtime.leases
    lease = keeper.register(claim.turn_id, claim.lease_token)
    try:
        with running_turn(claim.turn_id, claim.attempt):
            messages, usage = run_handler(claim, events, lease, started=started, runtime=runtime, journal=journal)
    except TurnCancelled:
        ended = claims.finish_turn(claim, TurnStatus.CANCELLED, engine=runtime.engine)
        if ended.stored:
            events.publish(EventType.CANCELLED, claim.attempt)
            registry.cancelled(hooks.Cancelled(turn=Facts.of_claim(claim, runtime.settings)))
            send_next(ended.next_turn, client=runtime.redis, tenant=claim.session.tenant)
        return Result(outcome=Outcome.CANCELLED, attempt=claim.attempt)
    except HandBack:
        return hand_back(claim, events, runtime=runtime, resumed_after=journal.finished_steps)
    except LeaseLost:
        registry.lost(hooks.Lost(turn=Facts.of_claim(claim, runtime.settings), storing=False))
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    except StepNotRecorded as exc:
        if exc.stale:
            # Another attempt holds the turn now (or it ended): this one stops, writing nothing more.
            registry.lost(hooks.Lost(turn=Facts.of_claim(claim, runtime.settings), storing=False))
            return Result(outcome=Outcome.LOST, attempt=claim.attempt)
        cause = exc.__cause__
        if cause is not None and is_refusal(cause):
            # Postgres refused what the step holds (a tool call's NaN, say): it refuses it every time.
            return fail(claim, events, refusal_message(cause, "a step of the turn"), runtime=runtime)
        if cause is None or not is_outage(cause):
            return fail(claim, events, exc.message, runtime=runtime)
        # Postgres went away under a journal write: an outage, as below (the delivery is retried).
        with contextlib.suppress(Exception):
            if claims.requeue_turn(claim, engine=runtime.engine, hand_back=True):
                events.publish(EventType.RETRY, claim.attempt, **resuming("a service restarted", journal))
        raise cause from exc
    except BudgetSpent as exc:
        # Its finished steps stay in the journal; their usage is stored on the turn and counted.
        return fail(claim, events, exc.message, runtime=runtime, reason=BUDGET_EXCEEDED, usage=journal.usage)
    except ProviderBusy as exc:
        return wait_for_provider(claim, events, exc, runtime=runtime)
    except AwaitingApproval as exc:
        paused = pause(claim, events, exc, runtime=runtime)
        outcome = Outcome.LOST if not paused.stored else Outcome.CANCELLED if paused.cancelled else Outcome.PAUSED
        return Result(outcome=outcome, attempt=claim.attempt)
    except AgentInvocationError as exc:
        return handle_agent_failure(claim, events, exc, runtime=runtime, resumed_after=journal.finished_steps)
    except (UnknownFramework, InvalidTurn, HandlerError, ConfigError) as exc:
        # Bad input or configuration (a model without its key): a retry would fail the same way.
        return fail(claim, events, exc.message, runtime=runtime)
    except Exception as exc:
        if is_outage(exc):
            # Infrastructure: give the turn back if the database lets us (else its lease runs out),
            # and let the task retry the delivery.
            with contextlib.suppress(Exception):
                if claims.requeue_turn(claim, engine=runtime.engine, hand_back=True):
                    events.publish(EventType.RETRY, claim.attempt, **resuming("a service restarted", journal))
            raise
        if is_refusal(exc):
            # Postgres refused a value the turn needed: the same data fails the same way every time.
            return fail(claim, events, refusal_message(exc, "what the turn needed"), runtime=runtime)
        # A handler broke its contract (it must raise AgentInvocationError): fail the turn now
        # rather than leave it running until its lease runs out, and keep the traceback in the log.
        log.exception("turn %s session %s: the handler raised an unexpected error", claim.turn_id, claim.session.id)
        return fail(claim, events, "the agent failed unexpectedly (internal error)", runtime=runtime)
    finally:
        keeper.unregister(lease)
    try:
        completed = claims.complete_turn(claim, messages, usage, engine=runtime.engine)
    except InvalidTurn as exc:
        return fail(claim, events, exc.message, runtime=runtime)
    except Exception as exc:
        if not is_refusal(exc):
            raise
        # Not an outage: a retry (or another worker taking the turn over) would run the handler
        # again only to be refused again, so the turn fails now, once.
        return fail(claim, events, refusal_message(exc, "the reply"), runtime=runtime)
    if not completed.stored:
        registry.lost(hooks.Lost(turn=Facts.of_claim(claim, runtime.settings), storing=True))
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    stored = time.monotonic() - started
    events.publish(
        EventType.FINAL,
        claim.attempt,
        messages=[message.to_dict() for message in messages],
        usage=usage,
    )
    registry.succeeded(
        hooks.Succeeded(
            turn=Facts.of_claim(claim, runtime.settings),
            seconds=stored,
            messages=len(messages),
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            total_tokens=usage.get("total_tokens", 0),
        )
    )
    send_next(completed.next_turn, client=runtime.redis, tenant=claim.session.tenant)
    return Result(outcome=Outcome.SUCCEEDED, attempt=claim.attempt, tokens=usage.get("total_tokens", 0))


def hand_back(claim: claims.Claim, events: TurnEvents, *, runtime: Runtime, resumed_after: int = 0) -> Result:
    """Requeue a turn interrupted by shutdown and send it again, so another worker runs it now
    (after its `resumed_after` finished steps)."""
    if not claims.requeue_turn(claim, engine=runtime.engine, hand_back=True):
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    why = "the worker is shutting down; another worker takes the turn"
    events.publish(EventType.RETRY, claim.attempt, **announced(why, resumed_after))
    send_turn(claim.to_message(), queue=claim.queue, client=runtime.redis, tenant=claim.session.tenant)
    runtime.hooks.handed_back(hooks.HandedBack(turn=Facts.of_claim(claim, runtime.settings), running=True))
    return Result(outcome=Outcome.HANDED_BACK, attempt=claim.attempt)


def handle_agent_failure(
    claim: claims.Claim,
    events: TurnEvents,
    exc: AgentInvocationError,
    *,
    runtime: Runtime,
    resumed_after: int = 0,
) -> Result:
    """Retry as the policy says (CHATQ_MAX_ATTEMPTS invocations in all), then fail the turn.

    The retry continues after the `resumed_after` steps the turn finished (its `retry` event says so)."""
    error = mask_secrets(exc.message)
    decision = runtime.retry.after_agent_failure(claim.attempt)
    if decision.retry:
        if claims.requeue_turn(claim, engine=runtime.engine, error=error):
            events.publish(EventType.RETRY, claim.attempt, **announced(error, resumed_after))
            runtime.hooks.retried(
                hooks.Retried(
                    turn=Facts.of_claim(claim, runtime.settings),
                    cause=decision.cause,
                    delay=decision.delay,
                    error=error,
                )
            )
            return Result(outcome=Outcome.RETRY, retry_after=decision.delay, attempt=claim.attempt)
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    return fail(claim, events, error, runtime=runtime)


def wait_for_provider(claim: claims.Claim, events: TurnEvents, exc: ProviderBusy, *, runtime: Runtime) -> Result:
    """The model service refused before the first text: wait as the policy says, or fail when patience ran out."""
    if not runtime.settings.provider_limits:
        return handle_agent_failure(claim, events, exc, runtime=runtime)
    decision = provider.on_busy(claim, events, exc, runtime=runtime)
    if decision is None:
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    if not decision.retry:
        return fail(claim, events, provider.patience_error(exc, runtime.settings), runtime=runtime)
    return Result(outcome=Outcome.WAITING, retry_after=decision.delay, attempt=claim.attempt)


def fail(
    claim: claims.Claim,
    events: TurnEvents,
    error: str,
    *,
    runtime: Runtime,
    reason: str | None = None,
    usage: Usage | None = None,
) -> Result:
    """End the turn as failed with a user-visible error (secrets masked, storable); `reason` goes in
    its `error` event (`budget_exceeded`), `usage` (its finished steps') is stored on the turn."""
    error = clean_text(mask_secrets(error))
    ended = claims.finish_turn(claim, TurnStatus.FAILED, error, engine=runtime.engine, usage=usage)
    if not ended.stored:
        return Result(outcome=Outcome.LOST, attempt=claim.attempt)
    events.publish(EventType.ERROR, claim.attempt, error=error, **({"reason": reason} if reason else {}))
    tokens = usage or {}
    failed = hooks.Failed(
        turn=Facts.of_claim(claim, runtime.settings),
        error=error,
        prompt_tokens=int(tokens.get("prompt_tokens", 0)),
        completion_tokens=int(tokens.get("completion_tokens", 0)),
    )
    runtime.hooks.failed(failed)
    send_next(ended.next_turn, client=runtime.redis, tenant=claim.session.tenant)
    return Result(outcome=Outcome.FAILED, attempt=claim.attempt, error=error)


def reject(turn_id: uuid.UUID, session_id: uuid.UUID | None, error: str, *, runtime: Runtime) -> None:
    """Refuse an invalid turn message: no retry, nothing stored, one clear log line.

    Consumers of the session's channel get an `error` event, unless a valid turn with this id
    exists (then the malformed message was a stray copy, and the real turn goes on).
    """
    error = clean_text(mask_secrets(error))
    runtime.hooks.rejected(hooks.Rejected(turn_id=turn_id, session_id=session_id, error=error))
    if turn_id.int == 0 or session_id is None:
        return
    publish_rejection(turn_id, session_id, error, runtime=runtime)


def publish_rejection(turn_id: uuid.UUID, session_id: uuid.UUID, error: str, *, runtime: Runtime) -> None:
    """The `error` event of a refused message, unless a valid turn with its id exists."""
    error = clean_text(mask_secrets(error))
    try:
        if turns.turn_exists(turn_id, engine=runtime.engine):
            return
    except Exception as exc:
        log.warning("turn %s: could not check for an existing turn: %s", turn_id, mask_secrets(str(exc)))
        return
    _events(session_id, turn_id, runtime).publish(EventType.ERROR, 0, error=error)


def _events(session_id: uuid.UUID, turn_id: uuid.UUID, runtime: Runtime) -> TurnEvents:
    """A publisher that continues the turn's numbering, on the runtime's Redis."""
    return TurnEvents.resume(
        session_id=session_id, turn_id=turn_id, client=runtime.redis, retention=runtime.settings.event_retention
    )

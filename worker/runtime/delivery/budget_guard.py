"""A turn's tenant budget at the runner's two checkpoints (`worker.budgets`, `CHATQ_TENANT_BUDGETS`).

- Before the turn starts (`admit`): a tenant whose spend this period already reached its budget
  gets its turn refused before any model request (the runner ends it `failed` with the reason);
  near the budget, a turn waits while others of its tenant run (`worker.budgets.Gate.WAIT`), so
  they reach it one at a time.
- At each finished step (`step_check`, which the turn's journal calls after it records a model
  message or a tool result): the spend, this turn's own unstored usage included, is read again;
  once it reaches the budget the check raises `BudgetSpent` and the turn stops there, its finished
  steps kept in the journal and their usage stored on the turn.

The first check that finds a budget spent announces it (once per tenant and period). A step
check that cannot reach Redis lets the turn go on (it was admitted; the next step checks again).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from chatq.masking import mask_secrets
from chatq.tenant_budgets import budget_for
from handlers.errors import BudgetSpent
from handlers.messages import Usage
from worker.budgets import Gate, Spend, usage_tokens
from worker.events import EventType, TurnEvents
from worker.runtime.delivery.process import Runtime
from worker.runtime.observers import hooks
from worker.runtime.observers.budget_hooks import ledger_of
from worker.runtime.observers.hooks import Facts
from worker.runtime.policy.retry import RetryDecision
from worker.store import claims

__all__ = ["admit", "hold", "release", "step_check"]

log = logging.getLogger(__name__)


def admit(claim: claims.Claim, runtime: Runtime) -> tuple[Gate, Spend] | None:
    """Whether the turn may start as far as its tenant's budget goes (`BudgetLedger.admit`), with the
    spend; None when its tenant has no budget (nothing asked, no round trip).

    One Redis round trip, plus a Postgres sum when the counter must be seeded. A refusal is
    announced. Redis errors propagate: the runner treats them as an outage.
    """
    tenant = claim.session.tenant
    budget = budget_for(runtime.settings.tenant_budgets, tenant)
    if budget is None or tenant is None:
        return None
    ledger = ledger_of(runtime.settings, runtime.redis, runtime.engine)
    # Admitted, the turn counts as running until it ends, or at most as long as one attempt may take.
    seconds = runtime.settings.turn_timeout + 2 * runtime.settings.lease_seconds
    gate, spend = ledger.admit(tenant, budget, turn_id=claim.turn_id, seconds=seconds)
    if gate is Gate.REFUSE:
        ledger.announce(spend)
    return gate, spend


def hold(claim: claims.Claim, spend: Spend, *, runtime: Runtime) -> RetryDecision | None:
    """Put a turn that must wait for its tenant's running turns back in the queue (as a slot wait
    does): its `retry` event with `waiting` reason `budget`, the `retried` hook. None: not ours any more."""
    decision = runtime.retry.when_budget_waits()
    if not claims.hold_turn(claim, engine=runtime.engine, seconds=decision.delay):
        return None
    why = f"tenant {spend.tenant} is near its {spend.budget.describe()} budget; its other turns run first"
    events = TurnEvents.resume(
        session_id=claim.session.id,
        turn_id=claim.turn_id,
        client=runtime.redis,
        retention=runtime.settings.event_retention,
    )
    until = round(time.time() + decision.delay, 3)
    events.publish(EventType.RETRY, max(claim.attempt - 1, 0), error=why, waiting={"reason": "budget", "until": until})
    facts = Facts.of_claim(claim, runtime.settings)
    runtime.hooks.retried(hooks.Retried(turn=facts, cause=decision.cause, delay=decision.delay, error=why))
    return decision


def release(claim: claims.Claim, runtime: Runtime) -> None:
    """The admitted turn's delivery is over: it no longer counts as running (best effort: the entry lapses)."""
    tenant = claim.session.tenant
    if tenant is None:
        return
    try:
        ledger_of(runtime.settings, runtime.redis, runtime.engine).release(tenant, claim.turn_id)
    except Exception as exc:
        log.warning("turn %s: its budget entry was not released: %s", claim.turn_id, mask_secrets(str(exc)))


def step_check(claim: claims.Claim, runtime: Runtime) -> Callable[[Usage], None] | None:
    """What the turn's journal calls after each finished step (None: its tenant has no budget)."""
    tenant = claim.session.tenant
    budget = budget_for(runtime.settings.tenant_budgets, tenant)
    if budget is None or tenant is None:
        return None
    ledger = ledger_of(runtime.settings, runtime.redis, runtime.engine)
    model = runtime.settings.session_model(claim.session.model)

    def check(usage: Usage) -> None:
        prompt, completion = usage_tokens(usage)
        try:
            spend = ledger.spend(tenant, budget).plus(prompt + completion, ledger.cost(model, prompt, completion))
        except Exception as exc:
            log.warning(
                "turn %s session %s: budget not checked at this step: %s",
                claim.turn_id,
                claim.session.id,
                mask_secrets(str(exc)),
            )
            return
        if spend.exceeded:
            with contextlib.suppress(Exception):  # the turn stops either way; a later check announces
                ledger.announce(spend)
            raise BudgetSpent(spend.reason())

    return check

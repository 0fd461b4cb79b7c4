"""A turn's tenant budget at the runner's two checkpoints (`worker.budgets`, `CHATQ_TENANT_BUDGETS`).

- Before the turn starts (`refusal`): a tenant whose spend this period already reached its budget
  gets its turn refused before any model request; the runner ends it `failed` with the reason.
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
from collections.abc import Callable

from chatq.masking import mask_secrets
from chatq.tenant_budgets import budget_for
from handlers.errors import BudgetSpent
from handlers.messages import Usage
from worker.budgets import Spend, usage_tokens
from worker.runtime.delivery.process import Runtime
from worker.runtime.observers.budget_hooks import ledger_of
from worker.store import claims

__all__ = ["refusal", "step_check"]

log = logging.getLogger(__name__)


def refusal(claim: claims.Claim, runtime: Runtime) -> Spend | None:
    """The tenant's spend when its budget is spent (the turn must not start), else None.

    Tenants without a budget cost nothing; with one, one Redis round trip (plus a Postgres sum when
    the counter must be seeded). Redis errors propagate: the runner treats them as an outage.
    """
    tenant = claim.session.tenant
    budget = budget_for(runtime.settings.tenant_budgets, tenant)
    if budget is None or tenant is None:
        return None
    ledger = ledger_of(runtime.settings, runtime.redis, runtime.engine)
    spend = ledger.spend(tenant, budget)
    if not spend.exceeded:
        return None
    ledger.announce(spend)
    return spend


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

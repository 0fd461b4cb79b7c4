"""The lifecycle hook that counts each turn's stored usage against its tenant's budget (`worker.budgets`).

When a turn's usage is stored (it succeeded, or its budget stopped it with its finished steps'
usage), its tokens and their price are added to the tenant's counter in Redis; the turn that
brings the spend to the budget announces it (`BudgetLedger.announce`, once per tenant and period).
Tenants without a budget cost nothing here: no Redis round trip.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from sqlalchemy import Engine

from chatq.settings import Settings
from chatq.tenant_budgets import budget_for
from worker.budgets import BudgetLedger
from worker.runtime.observers import hooks

__all__ = ["BudgetHooks", "ledger_of"]


def ledger_of(settings: Settings, client: redis.Redis, engine: Engine) -> BudgetLedger:
    """The budget counters as these settings configure them (cheap: it holds references only)."""
    return BudgetLedger(
        client=client,
        engine=engine,
        budgets=settings.tenant_budgets,
        prices=settings.prices,
        default_model=settings.default_model,
    )


class BudgetHooks(hooks.TurnHooks):
    """Adds a turn's stored tokens (and their USD cost) to its tenant's budget counter."""

    def __init__(
        self, settings: Callable[[], Settings], client: Callable[[], redis.Redis], engine: Callable[[], Engine]
    ) -> None:
        self._settings, self._client, self._engine = settings, client, engine

    def succeeded(self, event: hooks.Succeeded) -> None:
        self._count(event.turn, event.prompt_tokens, event.completion_tokens)

    def failed(self, event: hooks.Failed) -> None:
        if event.prompt_tokens or event.completion_tokens:
            self._count(event.turn, event.prompt_tokens, event.completion_tokens)

    def _count(self, turn: hooks.Facts, prompt: int, completion: int) -> None:
        settings = self._settings()
        budget = budget_for(settings.tenant_budgets, turn.tenant)
        if budget is None or turn.tenant is None:
            return
        ledger = ledger_of(settings, self._client(), self._engine())
        spend = ledger.add(
            turn.tenant, budget, tokens=prompt + completion, micro_usd=ledger.cost(turn.model, prompt, completion)
        )
        if spend.exceeded:
            ledger.announce(spend)

"""Spend per tenant for `chatq usage`: tokens and estimated cost of each tenant's sessions.

The sessions a tenant owns (`ChatSession.tenant`: a scoped gateway token's tenant, or the one
`chatq session create --tenant` / `create_session(tenant=...)` gave) and what is kept of its
deleted ones (`usage_rollups`) are summed per tenant and model, then priced per model with
`CHATQ_PRICES` as `usage_report` prices them; paid tool calls add what they cost when made.
Sessions without a tenant are one row with `tenant` None.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatSession, PaidToolCall, Turn, TurnStatus, UsageRollup
from worker.queries import COST_DECIMALS, WORKER_DEFAULT

__all__ = ["NO_TENANT", "TenantSpend", "format_tenant_spend", "spend_by_tenant"]

_WAITING = (TurnStatus.QUEUED, TurnStatus.DELAYED)
_RUNNING = (TurnStatus.RUNNING, TurnStatus.AWAITING_APPROVAL)

NO_TENANT = "(no tenant)"
"""How `chatq usage` shows the sessions that belong to no tenant."""


@dataclass(frozen=True, kw_only=True)
class TenantSpend:
    """One tenant's usage so far."""

    tenant: str | None
    """The tenant (None: sessions that belong to no tenant)."""
    turns: int
    """Turns of its sessions, deleted sessions' included."""
    total_tokens: int
    """Prompt plus completion tokens of those turns."""
    token_cost: Decimal | None
    """The tokens' estimated cost at today's prices; None: none of its models has a price."""
    tool_cost: Decimal
    """What its paid tool calls cost when they were made."""
    unpriced_models: tuple[str, ...]
    """Models its turns used that CHATQ_PRICES has no price for (the worker's default counts as one)."""
    waiting: int = 0
    """Its turns waiting now: queued (for a worker, a slot or its share) or delayed until due."""
    running: int = 0
    """Its turns running now, or paused for a person's approval."""
    slots: int | None = None
    """Slots its turns were given under the models' shared limits, fleet-wide, as long as Redis keeps
    the limits' state (a day after their last use); None: not read."""

    @property
    def estimated_cost(self) -> Decimal | None:
        """Tokens and tools; None when nothing of it has a price and no paid tool was called."""
        if self.token_cost is None:
            return self.tool_cost if self.tool_cost else None
        return self.token_cost + self.tool_cost

    def as_dict(self) -> dict[str, Any]:
        """The row as `chatq usage --json` prints it (costs as floats)."""
        return {
            "tenant": self.tenant,
            "turns": self.turns,
            "total_tokens": self.total_tokens,
            "token_cost": _money(self.token_cost),
            "tool_cost": _money(self.tool_cost),
            "estimated_cost": _money(self.estimated_cost),
            "unpriced_models": list(self.unpriced_models),
            "waiting": self.waiting,
            "running": self.running,
            "slots": self.slots,
        }


def spend_by_tenant(prices: str | None = None) -> list[TenantSpend]:
    """Every tenant's spend, tenants by name (no tenant last); `prices` is CHATQ_PRICES as configured."""
    from handlers.accounting import load_prices

    table = load_prices(prices)
    tokens = (
        select(
            ChatSession.tenant,
            ChatSession.model,
            func.count(Turn.id),
            func.coalesce(func.sum(Turn.prompt_tokens), 0),
            func.coalesce(func.sum(Turn.completion_tokens), 0),
        )
        .join(ChatSession, ChatSession.id == Turn.session_id)
        .group_by(ChatSession.tenant, ChatSession.model)
    )
    rolled_tokens = (
        select(
            UsageRollup.tenant,
            UsageRollup.model,
            func.sum(UsageRollup.turns),
            func.sum(UsageRollup.prompt_tokens),
            func.sum(UsageRollup.completion_tokens),
        )
        .where(UsageRollup.tool_name.is_(None))
        .group_by(UsageRollup.tenant, UsageRollup.model)
    )
    tools = (
        select(ChatSession.tenant, func.coalesce(func.sum(PaidToolCall.cost), 0))
        .join(ChatSession, ChatSession.id == PaidToolCall.session_id)
        .group_by(ChatSession.tenant)
    )
    rolled_tools = (
        select(UsageRollup.tenant, func.coalesce(func.sum(UsageRollup.tool_cost), 0))
        .where(UsageRollup.tool_name.is_not(None))
        .group_by(UsageRollup.tenant)
    )
    live = (
        select(ChatSession.tenant, Turn.status, func.count(Turn.id))
        .join(ChatSession, ChatSession.id == Turn.session_id)
        .where(Turn.status.in_([*_WAITING, *_RUNNING]))
        .group_by(ChatSession.tenant, Turn.status)
    )
    # tenant -> model -> [turns, prompt, completion]
    per_model: dict[str | None, dict[str | None, list[int]]] = {}
    tool_cost: dict[str | None, Decimal] = {}
    with session_scope() as db:
        for tenant, model, turns, prompt, completion in [*db.execute(tokens), *db.execute(rolled_tokens)]:
            totals = per_model.setdefault(tenant, {}).setdefault(model, [0, 0, 0])
            totals[0] += int(turns or 0)
            totals[1] += int(prompt or 0)
            totals[2] += int(completion or 0)
        for tenant, cost in [*db.execute(tools), *db.execute(rolled_tools)]:
            tool_cost[tenant] = tool_cost.get(tenant, Decimal(0)) + Decimal(cost or 0)
        now: dict[str | None, list[int]] = {}
        for tenant, status, count in db.execute(live):
            now.setdefault(tenant, [0, 0])[0 if status in _WAITING else 1] += int(count)
    rows: list[TenantSpend] = []
    for tenant in sorted(per_model.keys() | tool_cost.keys(), key=lambda name: (name is None, name or "")):
        token_cost: Decimal | None = None
        unpriced: list[str] = []
        turns = total = 0
        for model, (n, prompt, completion) in per_model.get(tenant, {}).items():
            turns += n
            total += prompt + completion
            # NULL: the worker's default model, which this process cannot know to price.
            cost = None if model is None else table.token_cost(model, prompt, completion)
            if cost is None:
                unpriced.append(model or WORKER_DEFAULT)
            else:
                token_cost = (token_cost or Decimal(0)) + cost
        rows.append(
            TenantSpend(
                tenant=tenant,
                turns=turns,
                total_tokens=total,
                token_cost=token_cost,
                tool_cost=tool_cost.get(tenant, Decimal(0)),
                unpriced_models=tuple(sorted(unpriced)),
                waiting=now.get(tenant, [0, 0])[0],
                running=now.get(tenant, [0, 0])[1],
            )
        )
    return rows


def format_tenant_spend(rows: list[TenantSpend], currency: str) -> list[str]:
    """The per-tenant table `chatq usage` prints under the per-model one."""

    def money(value: Decimal | None) -> str:
        return "-" if value is None else f"{float(value):.6f}"

    lines = [
        f"{'tenant':<32} {'turns':>8} {'tokens':>12} {'tools ' + currency:>14} {'cost ' + currency:>14}"
        f" {'waiting':>8} {'running':>8} {'slots':>8}"
    ]
    for row in rows:
        slots = "-" if row.slots is None else str(row.slots)
        lines.append(
            f"{row.tenant or NO_TENANT:<32} {row.turns:>8} {row.total_tokens:>12} "
            f"{money(row.tool_cost):>14} {money(row.estimated_cost):>14} {row.waiting:>8} {row.running:>8} {slots:>8}"
        )
    return lines


def _money(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, COST_DECIMALS))

"""Tenant budgets (`CHATQ_TENANT_BUDGETS`, `chatq.tenant_budgets`): what each tenant spent this period.

Postgres is the truth: a tenant's spend in a period is the tokens of its sessions' turns that ended
in it (`turns.finished_at` from the period's start, UTC) and of its deleted sessions' rollups of
those days, priced per model at `CHATQ_PRICES` for a USD budget. `chatq usage` reads it there.

The worker enforces budgets from a counter in Redis, one hash per tenant and period,
`chatq:budget:{tenant}:{period}` (`period` is `2026-12-04` or `2026-12`), with the fields `tokens`
and `micro_usd` (millionths of a dollar, rounded up per turn) and `announced`. It is seeded from
Postgres when it is missing (Redis keeps nothing on disk; a script writes the sums only if no
other worker did first), grows by each turn's usage when the turn's usage is stored (the lifecycle
hook `worker.runtime.observers.budget_hooks.BudgetHooks`), and expires a day after its period.
A turn stopped by its budget stores the usage of its finished steps, so it counts too.

When a tenant's spend reaches its budget, chatq announces it once per tenant and period: a
`budget_exceeded` event published on the Redis channel `chatq:budgets` and appended to the
stream `chatq:budget-events` (`BudgetLedger.announce`).

Paid tool calls are not counted against budgets: a budget counts model tokens.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import redis
from sqlalchemy import Connection, Engine, func, select, union

from chatq.settings import Settings
from chatq.tenant_budgets import ANY_TENANT, BudgetPeriod, BudgetUnit, TenantBudget, budget_for
from models.db import autocommit_scope
from models.tables import ChatSession, Turn, UsageRollup
from worker import budget_scripts as scripts

__all__ = [
    "ANNOUNCE_CHANNEL",
    "ANNOUNCE_STREAM",
    "BUDGET_EXCEEDED",
    "BudgetLedger",
    "Gate",
    "Spend",
    "budget_key",
    "budget_report",
    "format_budgets",
    "period_key",
    "period_start",
    "postgres_spend",
    "usd_micros",
]

log = logging.getLogger(__name__)

BUDGET_EXCEEDED = "budget_exceeded"
"""The `reason` of a turn refused or stopped by its tenant's budget, and the type of the announcement."""
ANNOUNCE_CHANNEL = "chatq:budgets"
"""The Redis pub/sub channel of `budget_exceeded` announcements."""
ANNOUNCE_STREAM = "chatq:budget-events"
"""The Redis stream that keeps the last announcements (about a thousand) for readers that were away."""
MICROS = Decimal(1_000_000)
ESTIMATE_SECONDS = 40 * 86_400
"""How long the largest price of a tenant's turn is kept without a turn of it ending."""


class Gate(enum.StrEnum):
    """What `BudgetLedger.admit` decided for a turn about to start."""

    ADMIT = "admit"
    """Start it: the budget is not spent, and it is the tenant's only turn or there is room for one more."""
    REFUSE = "refuse"
    """The budget is spent: the turn fails before any model request."""
    WAIT = "wait"
    """Other turns of the tenant run and one more could take the spend past the budget: wait for them."""


def period_start(period: BudgetPeriod, now: datetime) -> datetime:
    """The UTC start of the day or month `now` falls in."""
    now = now.astimezone(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period is BudgetPeriod.DAY else day.replace(day=1)


def period_end(period: BudgetPeriod, now: datetime) -> datetime:
    """The UTC start of the next day or month after `now`'s."""
    start = period_start(period, now)
    if period is BudgetPeriod.DAY:
        return start + timedelta(days=1)
    return (start + timedelta(days=32)).replace(day=1)


def period_key(period: BudgetPeriod, now: datetime) -> str:
    """The period's name: `2026-12-04` for a day, `2026-12` for a month."""
    start = period_start(period, now)
    return start.strftime("%Y-%m-%d" if period is BudgetPeriod.DAY else "%Y-%m")


def budget_key(tenant: str, period: str) -> str:
    """The Redis hash of a tenant's spend in a period."""
    return f"chatq:budget:{tenant}:{period}"


def usd_micros(cost: Decimal | None) -> int:
    """A cost in millionths of a dollar, rounded up (a budget never counts less than was spent)."""
    return 0 if cost is None else math.ceil(cost * MICROS)


@dataclass(frozen=True, kw_only=True)
class Spend:
    """A tenant's spend in the current period of its budget."""

    tenant: str
    """The tenant."""
    budget: TenantBudget
    """Its budget (its own entry, or `*`'s)."""
    period: str
    """The period: `2026-12-04` or `2026-12` (UTC)."""
    tokens: int
    """Prompt plus completion tokens used in the period."""
    micro_usd: int
    """Their estimated cost at `CHATQ_PRICES`, in millionths of a dollar (unpriced models count 0)."""

    @property
    def spent(self) -> Decimal:
        """What was spent, in the budget's unit (dollars or tokens)."""
        if self.budget.unit is BudgetUnit.USD:
            return Decimal(self.micro_usd) / MICROS
        return Decimal(self.tokens)

    @property
    def left(self) -> Decimal:
        """What is left of the budget (never below 0)."""
        return max(Decimal(0), self.budget.limit - self.spent)

    @property
    def exceeded(self) -> bool:
        """Whether the budget is spent: no new turn of the tenant starts, a running one stops at its next step."""
        return self.spent >= self.budget.limit

    def plus(self, tokens: int, micro_usd: int) -> Spend:
        """This spend with a running turn's usage so far added."""
        return Spend(
            tenant=self.tenant,
            budget=self.budget,
            period=self.period,
            tokens=self.tokens + tokens,
            micro_usd=self.micro_usd + micro_usd,
        )

    def reason(self) -> str:
        """The error a refused or stopped turn stores: what was spent of which budget."""
        if self.budget.unit is BudgetUnit.USD:
            spent = f"${self.spent.quantize(Decimal('0.01'), rounding='ROUND_UP')}"
        else:
            spent = f"{self.tokens} tokens"
        return (
            f"budget exceeded: tenant {self.tenant} spent {spent} of its {self.budget.describe()} budget "
            f"for {self.period} (CHATQ_TENANT_BUDGETS)"
        )

    def as_dict(self) -> dict[str, Any]:
        """The spend as `chatq usage --json` and the announcement carry it (amounts as numbers)."""
        return {
            "tenant": self.tenant,
            "budget": float(self.budget.limit),
            "unit": self.budget.unit.value,
            "period": self.budget.period.value,
            "period_start": self.period,
            "spent": float(self.spent),
            "left": float(self.left),
            "tokens": self.tokens,
            "exceeded": self.exceeded,
        }


def postgres_spend(
    db: Connection, *, tenant: str, start: datetime, prices: str | None, default_model: str | None
) -> tuple[int, int]:
    """(tokens, micro-USD) the tenant's turns used since `start`, from Postgres (the truth).

    Sessions without a model ran on their worker's default: `default_model` prices them (None:
    they count 0 USD, as `chatq usage` leaves them unpriced).
    """
    from handlers.accounting import load_prices

    table = load_prices(prices)
    live = (
        select(ChatSession.model, func.sum(Turn.prompt_tokens), func.sum(Turn.completion_tokens))
        .join(ChatSession, ChatSession.id == Turn.session_id)
        .where(ChatSession.tenant == tenant, Turn.finished_at >= start)
        .group_by(ChatSession.model)
    )
    rolled = (
        select(UsageRollup.model, func.sum(UsageRollup.prompt_tokens), func.sum(UsageRollup.completion_tokens))
        .where(UsageRollup.tenant == tenant, UsageRollup.tool_name.is_(None), UsageRollup.day >= start.date())
        .group_by(UsageRollup.model)
    )
    tokens = micros = 0
    for model, prompt_sum, completion_sum in [*db.execute(live), *db.execute(rolled)]:
        prompt, completion = int(prompt_sum or 0), int(completion_sum or 0)
        tokens += prompt + completion
        name = model or default_model
        if name:
            micros += usd_micros(table.token_cost(name, prompt, completion))
    return tokens, micros


class BudgetLedger:
    """The Redis counters of tenants' spend, seeded from Postgres (one per worker process's runtime)."""

    def __init__(
        self,
        *,
        client: redis.Redis,
        engine: Engine,
        budgets: tuple[TenantBudget, ...],
        prices: str | None,
        default_model: str | None,
    ) -> None:
        self.client = client
        self.engine = engine
        self.budgets = budgets
        self.prices = prices
        self.default_model = default_model

    def cost(self, model: str | None, prompt_tokens: int, completion_tokens: int) -> int:
        """The micro-USD cost of a usage on `model` (0 when it has no price)."""
        from handlers.accounting import load_prices

        name = model or self.default_model
        if not name:
            return 0
        return usd_micros(load_prices(self.prices).token_cost(name, prompt_tokens, completion_tokens))

    def spend(self, tenant: str, budget: TenantBudget, *, now: datetime | None = None) -> Spend:
        """The tenant's spend this period: one Redis round trip, plus a Postgres sum when the counter is missing."""
        now = now or datetime.now(UTC)
        period = period_key(budget.period, now)
        key = budget_key(tenant, period)
        found: list[Any] = list(self.client.hmget(key, ["tokens", "micro_usd"]))
        if found[0] is None:
            found = self._seed(tenant, budget, key, now)
        return Spend(tenant=tenant, budget=budget, period=period, tokens=int(found[0]), micro_usd=int(found[1]))

    def _seed(self, tenant: str, budget: TenantBudget, key: str, now: datetime) -> list[Any]:
        with autocommit_scope(self.engine) as db:
            tokens, micros = postgres_spend(
                db,
                tenant=tenant,
                start=period_start(budget.period, now),
                prices=self.prices,
                default_model=self.default_model,
            )
        expires = int((period_end(budget.period, now) + timedelta(days=1)).timestamp())
        log.info("budget of tenant %s: counter %s seeded from Postgres (%d tokens)", tenant, key, tokens)
        return list(self.client.eval(scripts.SEED, 1, key, tokens, micros, expires))

    def add(
        self, tenant: str, budget: TenantBudget, *, tokens: int, micro_usd: int, now: datetime | None = None
    ) -> Spend:
        """Count a turn's stored usage; a missing counter is seeded instead (Postgres holds the turn by then)."""
        now = now or datetime.now(UTC)
        period = period_key(budget.period, now)
        key = budget_key(tenant, period)
        keys = (key, _tenant_key(tenant, "estimate"))
        found = self.client.eval(scripts.ADD, 2, *keys, tokens, micro_usd, ESTIMATE_SECONDS)
        if not found:
            return self.spend(tenant, budget, now=now)
        return Spend(tenant=tenant, budget=budget, period=period, tokens=int(found[0]), micro_usd=int(found[1]))

    def admit(self, tenant: str, budget: TenantBudget, *, turn_id: object, seconds: float) -> tuple[Gate, Spend]:
        """Whether a turn of the tenant may start, with the spend the answer was based on.

        Admitted, the turn counts as running for `seconds` (its longest possible attempt) or until
        `release`. While other turns of the tenant run, one more starts only if the spend plus the
        largest price one of its turns had, for each running turn and this one, stays within the
        budget (none known yet: it waits); so near the budget its turns run one at a time, and the
        budget is overrun by at most the last turn's price.
        """
        now = datetime.now(UTC)
        spend = self.spend(tenant, budget, now=now)
        field, limit = _field_and_limit(budget)
        keys = (budget_key(tenant, spend.period), _tenant_key(tenant, "running"), _tenant_key(tenant, "estimate"))
        stamp = time.time()
        lifetime = int(seconds) + 60
        answer = self.client.eval(scripts.ADMIT, 3, *keys, field, limit, stamp, stamp + seconds, str(turn_id), lifetime)
        if _text(answer[0]) == "missing":  # the spend expired just now: summed again by the next call
            return self.admit(tenant, budget, turn_id=turn_id, seconds=seconds)
        spent = int(float(_text(answer[1])))  # as the script read it
        if field == "tokens":
            return Gate(_text(answer[0])), dataclasses.replace(spend, tokens=spent)
        return Gate(_text(answer[0])), dataclasses.replace(spend, micro_usd=spent)

    def release(self, tenant: str, turn_id: object) -> None:
        """The admitted turn ended (or goes back to the queue): it no longer counts as running."""
        self.client.zrem(_tenant_key(tenant, "running"), str(turn_id))

    def announce(self, spend: Spend) -> bool:
        """Publish the tenant's `budget_exceeded` announcement, once per period; True if this call did."""
        event = {"type": BUDGET_EXCEEDED, "ts": round(time.time(), 3), **spend.as_dict()}
        keys = (budget_key(spend.tenant, spend.period), ANNOUNCE_CHANNEL, ANNOUNCE_STREAM)
        payload = json.dumps(event, separators=(",", ":"))
        done = bool(self.client.eval(scripts.ANNOUNCE, 3, *keys, "1", payload))
        if done:
            log.warning("tenant %s: %s", spend.tenant, spend.reason())
        return done


def usage_tokens(usage: Mapping[str, int]) -> tuple[int, int]:
    """(prompt, completion) tokens of a usage mapping."""
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def budget_report(settings: Settings, *, tenant: str | None = None, now: datetime | None = None) -> list[Spend]:
    """Each tenant's spend against its budget this period, from Postgres (what `chatq usage` shows).

    `tenant`: that tenant only (no row when it has no budget). Otherwise every tenant named in
    `CHATQ_TENANT_BUDGETS` and, with a `*` entry, every tenant that owns a session or a rollup.
    """
    budgets = settings.tenant_budgets
    if not budgets:
        return []
    now = now or datetime.now(UTC)
    with autocommit_scope() as db:
        if tenant is not None:
            names = [tenant]
        else:
            named = {budget.tenant for budget in budgets if budget.tenant != ANY_TENANT}
            if any(budget.tenant == ANY_TENANT for budget in budgets):
                owners = union(
                    select(ChatSession.tenant).where(ChatSession.tenant.is_not(None)).distinct(),
                    select(UsageRollup.tenant).where(UsageRollup.tenant.is_not(None)).distinct(),
                )
                named |= {str(name) for name in db.execute(owners).scalars()}
            names = sorted(named)
        rows: list[Spend] = []
        for name in names:
            budget = budget_for(budgets, name)
            if budget is None:
                continue
            start = period_start(budget.period, now)
            tokens, micros = postgres_spend(
                db, tenant=name, start=start, prices=settings.prices, default_model=settings.default_model
            )
            period = period_key(budget.period, now)
            rows.append(Spend(tenant=name, budget=budget, period=period, tokens=tokens, micro_usd=micros))
    return rows


def format_budgets(rows: list[Spend]) -> list[str]:
    """The budget table `chatq usage` prints: tenant, budget, period, spent, left."""
    lines = [f"{'tenant':<32} {'budget':>22} {'period':>12} {'spent':>16} {'left':>16}"]
    for row in rows:
        usd = row.budget.unit is BudgetUnit.USD
        spent = f"${row.spent:.6f}" if usd else f"{row.tokens} tokens"
        left = f"${row.left:.6f}" if usd else f"{int(row.left)} tokens"
        flag = "  SPENT" if row.exceeded else ""
        lines.append(f"{row.tenant:<32} {row.budget.describe():>22} {row.period:>12} {spent:>16} {left:>16}{flag}")
    return lines


def _tenant_key(tenant: str, name: str) -> str:
    return f"chatq:budget:{tenant}:{name}"


def _field_and_limit(budget: TenantBudget) -> tuple[str, int]:
    """The spend hash's field a budget counts, and its limit in that field's unit."""
    if budget.unit is BudgetUnit.USD:
        return "micro_usd", math.floor(budget.limit * MICROS)
    return "tokens", int(budget.limit)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

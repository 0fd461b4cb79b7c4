"""`CHATQ_TENANT_BUDGETS`: how much each tenant may spend per UTC day or month, as configured.

A comma-separated list of `TENANT=AMOUNT UNIT/PERIOD` entries:

    acme=20usd/day,beta=1000000tokens/month,*=5usd/day

- `TENANT` names a session's tenant (`ChatSession.tenant`); `*` is every tenant without its own
  entry. Sessions that belong to no tenant have no budget.
- `AMOUNT` is a positive number (`20`, `2.5`); `UNIT` is `usd` (the estimated cost of the model's
  tokens at `CHATQ_PRICES`) or `tokens` (prompt plus completion tokens, whole numbers only).
- `PERIOD` is `day` or `month`: the UTC calendar day or month; spend starts from zero at each.

Parsed once at start-up (`chatq.settings`), so a bad entry stops the worker or the CLI with one
line naming it. Spending is counted and enforced by the worker (`worker.budgets`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from chatq.errors import ConfigError
from chatq.tenants import TENANT_RULE, is_tenant_name

__all__ = ["ANY_TENANT", "BudgetPeriod", "BudgetUnit", "TenantBudget", "budget_for", "parse_tenant_budgets"]

ANY_TENANT = "*"
"""The entry that applies to every tenant without its own."""

VARIABLE = "CHATQ_TENANT_BUDGETS"


class BudgetUnit(enum.StrEnum):
    """What a budget counts."""

    USD = "usd"
    """Estimated cost in US dollars of the model tokens used, at `CHATQ_PRICES`."""
    TOKENS = "tokens"
    """Prompt plus completion tokens."""


class BudgetPeriod(enum.StrEnum):
    """The UTC calendar span a budget covers; spend starts from zero at the next one."""

    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True, kw_only=True)
class TenantBudget:
    """One entry of `CHATQ_TENANT_BUDGETS`."""

    tenant: str
    """The tenant it applies to, or `*` (every tenant without its own entry)."""
    limit: Decimal
    """How much the tenant may spend per period, in `unit` (a whole number for tokens)."""
    unit: BudgetUnit
    """US dollars (at `CHATQ_PRICES`) or tokens."""
    period: BudgetPeriod
    """A UTC calendar day or month."""

    def describe(self) -> str:
        """The limit as people read it: `$20/day`, `1000000 tokens/month`."""
        if self.unit is BudgetUnit.USD:
            return f"${_plain(self.limit)}/{self.period.value}"
        return f"{_plain(self.limit)} tokens/{self.period.value}"


_ENTRY = re.compile(r"^\s*([^=\s]+)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*(usd|\$|tokens?)\s*/\s*(day|month)\s*$", re.I)


def parse_tenant_budgets(raw: str | None) -> tuple[TenantBudget, ...]:
    """The entries of `raw`; ConfigError names what is wrong (one line)."""
    budgets: list[TenantBudget] = []
    seen: set[str] = set()
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        found = _ENTRY.match(part)
        if found is None:
            raise ConfigError(
                f"{VARIABLE}: {part.strip()!r} is not TENANT=AMOUNT UNIT/PERIOD (such as acme=20usd/day or "
                "beta=1000000tokens/month; units usd or tokens, periods day or month)"
            )
        tenant, amount, unit, period = found.groups()
        if tenant != ANY_TENANT and not is_tenant_name(tenant):
            raise ConfigError(f"{VARIABLE}: tenant {tenant!r} is not a tenant name ({TENANT_RULE}) or '*'")
        if tenant in seen:
            raise ConfigError(f"{VARIABLE}: tenant {tenant!r} has two budgets")
        seen.add(tenant)
        try:
            limit = Decimal(amount)
        except InvalidOperation:  # pragma: no cover (the pattern admits only numbers)
            raise ConfigError(f"{VARIABLE}: {amount!r} is not a number") from None
        kind = BudgetUnit.USD if unit.lower() in ("usd", "$") else BudgetUnit.TOKENS
        if limit <= 0:
            raise ConfigError(f"{VARIABLE}: the budget of {tenant!r} must be more than 0, got {amount!r}")
        if kind is BudgetUnit.TOKENS and limit != limit.to_integral_value():
            raise ConfigError(f"{VARIABLE}: the token budget of {tenant!r} must be a whole number, got {amount!r}")
        budgets.append(TenantBudget(tenant=tenant, limit=limit, unit=kind, period=BudgetPeriod(period.lower())))
    return tuple(budgets)


def budget_for(budgets: tuple[TenantBudget, ...], tenant: str | None) -> TenantBudget | None:
    """The budget of `tenant`: its own entry, else `*`'s; None for no tenant or no entry."""
    if tenant is None or not budgets:
        return None
    anyone: TenantBudget | None = None
    for budget in budgets:
        if budget.tenant == tenant:
            return budget
        if budget.tenant == ANY_TENANT:
            anyone = budget
    return anyone


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")

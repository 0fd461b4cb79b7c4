"""`CHATQ_TENANT_BUDGETS`: its syntax, its one-line errors, which entry a tenant gets, and the spend arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from chatq.errors import ConfigError
from chatq.settings import load_settings
from chatq.tenant_budgets import BudgetPeriod, BudgetUnit, TenantBudget, budget_for, parse_tenant_budgets
from worker.budgets import Spend, budget_key, period_end, period_key, period_start, usd_micros


def test_entries_parse_with_their_unit_and_period() -> None:
    budgets = parse_tenant_budgets(" acme=20usd/day, beta = 1000000 tokens / month ,*=2.5USD/Month,")
    assert budgets == (
        TenantBudget(tenant="acme", limit=Decimal(20), unit=BudgetUnit.USD, period=BudgetPeriod.DAY),
        TenantBudget(tenant="beta", limit=Decimal(1_000_000), unit=BudgetUnit.TOKENS, period=BudgetPeriod.MONTH),
        TenantBudget(tenant="*", limit=Decimal("2.5"), unit=BudgetUnit.USD, period=BudgetPeriod.MONTH),
    )
    assert [b.describe() for b in budgets] == ["$20/day", "1000000 tokens/month", "$2.5/month"]
    assert parse_tenant_budgets(None) == parse_tenant_budgets("  ") == ()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("acme=20", "is not TENANT=AMOUNT UNIT/PERIOD"),
        ("acme=20eur/day", "is not TENANT=AMOUNT UNIT/PERIOD"),
        ("acme=20usd/week", "is not TENANT=AMOUNT UNIT/PERIOD"),
        ("acme=-1usd/day", "is not TENANT=AMOUNT UNIT/PERIOD"),
        ("acme=0usd/day", "must be more than 0"),
        ("acme=1.5tokens/day", "must be a whole number"),
        ("acme=1usd/day,acme=2usd/day", "has two budgets"),
        ("=1usd/day", "is not TENANT=AMOUNT UNIT/PERIOD"),
        ("-acme=1usd/day", "is not a tenant name"),
        ("ac/me=1usd/day", "is not a tenant name"),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_variable(raw: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"CHATQ_TENANT_BUDGETS": raw})
    message = caught.value.message
    assert message.startswith("CHATQ_TENANT_BUDGETS: ") and says in message and "\n" not in message


def test_settings_carry_the_budgets() -> None:
    settings = load_settings({"CHATQ_TENANT_BUDGETS": "acme=20usd/day"})
    assert settings.tenant_budgets == parse_tenant_budgets("acme=20usd/day")
    assert load_settings({}).tenant_budgets == ()


def test_a_tenant_gets_its_own_entry_else_the_star_and_no_tenant_none() -> None:
    budgets = parse_tenant_budgets("*=5usd/day,acme=20usd/day")
    assert budget_for(budgets, "acme") == budgets[1]
    assert budget_for(budgets, "other") == budgets[0]
    assert budget_for(budgets, None) is None
    assert budget_for(parse_tenant_budgets("acme=20usd/day"), "other") is None


def test_periods_are_utc_calendar_days_and_months() -> None:
    now = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)
    assert period_key(BudgetPeriod.DAY, now) == "2026-12-31"
    assert period_key(BudgetPeriod.MONTH, now) == "2026-12"
    assert period_start(BudgetPeriod.MONTH, now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert period_end(BudgetPeriod.DAY, now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end(BudgetPeriod.MONTH, datetime(2026, 1, 31, tzinfo=UTC)) == datetime(2026, 2, 1, tzinfo=UTC)
    assert budget_key("acme", "2026-12") == "chatq:budget:acme:2026-12"


def test_spend_against_a_usd_budget_and_its_reason() -> None:
    budget = parse_tenant_budgets("acme=20usd/day")[0]
    spend = Spend(tenant="acme", budget=budget, period="2026-12-04", tokens=10, micro_usd=19_999_999)
    assert not spend.exceeded and spend.left == Decimal("0.000001")
    over = spend.plus(5, 10_001)
    assert over.exceeded and over.spent == Decimal("20.01") and over.left == 0 and over.tokens == 15
    assert over.reason() == (
        "budget exceeded: tenant acme spent $20.01 of its $20/day budget for 2026-12-04 (CHATQ_TENANT_BUDGETS)"
    )
    assert usd_micros(Decimal("0.0000001")) == 1 and usd_micros(None) == 0


def test_spend_against_a_token_budget() -> None:
    budget = parse_tenant_budgets("beta=100tokens/month")[0]
    spend = Spend(tenant="beta", budget=budget, period="2026-12", tokens=100, micro_usd=0)
    assert spend.exceeded and "spent 100 tokens of its 100 tokens/month budget" in spend.reason()
    assert spend.as_dict()["left"] == 0.0 and spend.as_dict()["unit"] == "tokens"

"""`chatq usage` per tenant: `--tenant T` narrows the report, the overall report adds a row per tenant."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import update

from models.db import session_scope
from models.tables import ChatSession, Turn, TurnStatus
from tests.support.cli import chatq_here
from tests.support.factories import add_turn, assistant, create_session, user
from worker.events import get_redis
from worker.producer import delete_session
from worker.queries import usage_report
from worker.runtime.policy import limits
from worker.runtime.policy.limits import Scope
from worker.tenant_usage import spend_by_tenant

pytestmark = pytest.mark.usefixtures("chatq_env")

PRICES = '{"models": {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}, "currency": "USD"}'


def _tenant_session(tenant: str | None, model: str = "gpt-4o-mini") -> uuid.UUID:
    session_id = create_session(model=model)
    with session_scope() as db:
        db.execute(update(ChatSession).where(ChatSession.id == session_id).values(tenant=tenant))
    return session_id


def _turn(session_id: uuid.UUID, prompt: int, completion: int) -> None:
    ref = add_turn(session_id, [user("q"), assistant("a")])
    with session_scope() as db:
        db.execute(
            update(Turn)
            .where(Turn.id == ref.id)
            .values(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        )


def _names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"acme-{suffix}", f"globex-{suffix}"


def test_a_tenant_report_counts_only_that_tenants_sessions() -> None:
    acme, globex = _names()
    _turn(_tenant_session(acme), 1_000_000, 0)
    _turn(_tenant_session(acme), 0, 1_000_000)
    _turn(_tenant_session(globex), 2_000_000, 0)
    report = usage_report(tenant=acme, prices=PRICES)
    assert (report["tenant"], report["turns"], report["prompt_tokens"], report["completion_tokens"]) == (
        acme,
        2,
        1_000_000,
        1_000_000,
    )
    assert report["estimated_cost"] == pytest.approx(0.15 + 0.6)
    nobody = usage_report(tenant=f"nobody-{uuid.uuid4().hex[:8]}", prices=PRICES)
    assert (nobody["turns"], nobody["total_tokens"]) == (0, 0)


def test_spend_by_tenant_prices_each_model_and_keeps_deleted_sessions() -> None:
    acme, globex = _names()
    kept = _tenant_session(acme)
    _turn(kept, 1_000_000, 0)
    gone = _tenant_session(acme)
    _turn(gone, 0, 1_000_000)
    _turn(_tenant_session(acme, model="unpriced-model"), 10, 10)
    _turn(_tenant_session(globex), 2_000_000, 0)
    delete_session(gone)  # its usage lives on in usage_rollups, still the tenant's
    rows = {row.tenant: row for row in spend_by_tenant(PRICES)}
    assert (rows[acme].turns, rows[acme].total_tokens) == (3, 2_000_020)
    assert rows[acme].token_cost == Decimal("0.15") + Decimal("0.6")
    assert rows[acme].unpriced_models == ("unpriced-model",)
    assert (rows[globex].turns, rows[globex].estimated_cost) == (1, Decimal("0.30"))
    # Per-tenant figures add up to the overall report.
    overall = usage_report(prices=PRICES)
    assert sum(row.turns for row in rows.values()) == overall["turns"]


def test_each_tenant_shows_its_turns_waiting_and_running_now() -> None:
    acme, globex = _names()
    session = _tenant_session(acme)
    _turn(session, 10, 10)
    add_turn(session, [user("waits")], status=TurnStatus.QUEUED)
    add_turn(_tenant_session(acme), [user("waits too")], status=TurnStatus.QUEUED)
    add_turn(_tenant_session(acme), [user("runs")], status=TurnStatus.RUNNING)
    add_turn(_tenant_session(globex), [user("paused")], status=TurnStatus.AWAITING_APPROVAL)
    add_turn(_tenant_session(globex), [user("failed")], status=TurnStatus.FAILED)
    rows = {row.tenant: row for row in spend_by_tenant(PRICES)}
    assert (rows[acme].waiting, rows[acme].running, rows[acme].turns) == (2, 1, 4)
    assert (rows[globex].waiting, rows[globex].running) == (0, 1)
    assert rows[acme].as_dict()["waiting"] == 2


def test_the_cli_shows_tenants_overall_and_narrows_with_tenant(chatq_env: dict[str, str]) -> None:
    acme, globex = _names()
    _turn(_tenant_session(acme), 1_000_000, 0)
    _turn(_tenant_session(globex), 0, 1_000_000)
    env = {**chatq_env, "CHATQ_PRICES": PRICES}
    everything = chatq_here(env, "usage")
    assert everything.returncode == 0, everything.stderr
    lines = [line.split() for line in everything.stdout.splitlines()]
    assert ["tenant", "turns", "tokens", "tools", "USD", "cost", "USD", "waiting", "running", "slots"] in lines
    assert [acme, "1", "1000000", "0.000000", "0.150000", "0", "0", "0"] in lines
    assert [globex, "1", "1000000", "0.000000", "0.600000", "0", "0", "0"] in lines

    narrowed = chatq_here(env, "usage", "--tenant", acme, "--json")
    assert narrowed.returncode == 0, narrowed.stderr
    report = json.loads(narrowed.stdout)
    assert (report["tenant"], report["turns"], report["estimated_cost"]) == (acme, 1, pytest.approx(0.15))
    assert "by_tenant" not in report

    as_json = json.loads(chatq_here(env, "usage", "--json").stdout)
    by_tenant = {row["tenant"]: row for row in as_json["by_tenant"]}
    assert by_tenant[globex]["estimated_cost"] == pytest.approx(0.6)
    assert by_tenant[globex]["slots"] == 0


def test_the_cli_shows_the_slots_each_tenant_received_under_the_limits(chatq_env: dict[str, str]) -> None:
    acme, globex = _names()
    _turn(_tenant_session(acme), 10, 10)
    _turn(_tenant_session(globex), 10, 10)
    scopes = [Scope(key=f"usage-{uuid.uuid4().hex[:8]}@http://stub/v1", model="m", rpm=6000) for _ in range(2)]
    try:
        for number, scope in enumerate(scopes):  # two models' limits: the slots add up
            for turn in range(3 + number):
                grant = limits.acquire(
                    get_redis(), scope, f"t{turn}", interactive=False, hint_tokens=1, lease_seconds=5, tenant=acme
                )
                assert grant.granted
        limits.acquire(get_redis(), scopes[0], "g", interactive=False, hint_tokens=1, lease_seconds=5, tenant=globex)
        by_tenant = {
            row["tenant"]: row for row in json.loads(chatq_here(chatq_env, "usage", "--json").stdout)["by_tenant"]
        }
        assert (by_tenant[acme]["slots"], by_tenant[globex]["slots"]) == (7, 1)
    finally:
        for scope in scopes:
            get_redis().delete(*scope.keys(), *scope.share_keys())

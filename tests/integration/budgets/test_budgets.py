"""Tenant budgets (`CHATQ_TENANT_BUDGETS`), run in this process against the real Postgres, Redis and model stub.

A turn of a tenant over its budget fails before any model request; a running turn stops at its
next journaled step once the spend reaches the budget, its finished steps kept; the Redis counter
is reseeded from Postgres when it is gone; `chatq usage` shows spend against each budget.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import redis
from sqlalchemy import select, update

from chatq.settings import get_settings, reset_settings
from handlers.journal import StepKind
from models.db import session_scope
from models.tables import ChatSession, Turn, TurnStatus
from tests.support.cli import chatq_here
from tests.support.env import environ
from tests.support.factories import add_turn, assistant, user
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, stored_turn, turn_messages
from worker.budgets import ANNOUNCE_STREAM, BUDGET_EXCEEDED, Gate, budget_key, period_key
from worker.payload import INTERACTIVE_QUEUE, TurnRequest, parse_turn_request
from worker.producer import create_session
from worker.runtime.delivery.runner import Outcome, Result, execute_turn
from worker.runtime.observers.budget_hooks import ledger_of
from worker.store.journal import read_steps

WORKER = "in-process@budgets"
PRICES = '{"models": {"gpt-4o-mini": {"prompt": 1.0, "completion": 2.0}}, "currency": "USD"}'
"""Dollars per million tokens: a turn of the stub costs a few ten-thousandths of a dollar."""


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def budgets(chatq_env: dict[str, str], openai_stub: OpenAIStub) -> Iterator[dict[str, str]]:
    """A worker on the stub whose budgets each test sets (`_configure`)."""
    env = {"OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_API_KEY": STUB_API_KEY, "CHATQ_RETRY_DELAY": "0"}
    with environ(**env):
        reset_settings()
        yield env
    reset_settings()


def _configure(value: str, prices: str | None = None) -> None:
    import os

    os.environ["CHATQ_TENANT_BUDGETS"] = value
    if prices is not None:
        os.environ["CHATQ_PRICES"] = prices
    reset_settings()


@pytest.fixture(autouse=True)
def _forget_budget_variables() -> Iterator[None]:
    import os

    yield
    for name in ("CHATQ_TENANT_BUDGETS", "CHATQ_PRICES"):
        os.environ.pop(name, None)
    reset_settings()


def _run(session_id: uuid.UUID, content: str) -> tuple[TurnRequest, Result]:
    request = parse_turn_request(
        {"session_id": str(session_id), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
    )
    return request, execute_turn(request, queue=INTERACTIVE_QUEUE, worker=WORKER, runtime=build_runtime())


def _requests_with(stub: OpenAIStub, marker: str) -> int:
    return sum(marker in json.dumps(body.get("messages")) for body in stub.requests)


def _counter(redis_url: str, tenant: str, period: str) -> dict[str, int]:
    client = redis.Redis.from_url(redis_url)
    try:
        found = client.hgetall(budget_key(tenant, period))
        return {key.decode(): int(value) for key, value in found.items()}
    finally:
        client.close()


def _announcements(redis_url: str, tenant: str) -> list[dict[str, object]]:
    client = redis.Redis.from_url(redis_url)
    try:
        events = [json.loads(fields[b"event"]) for _id, fields in client.xrange(ANNOUNCE_STREAM)]
        return [event for event in events if event["tenant"] == tenant]
    finally:
        client.close()


def _today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def test_a_turn_over_budget_is_refused_before_any_model_request(
    budgets: dict[str, str], openai_stub: OpenAIStub, redis_url: str
) -> None:
    acme, other = _tenant(), _tenant()
    _configure(f"{acme}=10tokens/day,{other}=1000000tokens/day")
    session = create_session(model="gpt-4o-mini", tenant=acme)

    admitted = f"admitted-{uuid.uuid4().hex}"
    first, done = _run(session, f"{admitted} [words: 5]")  # spend 0: admitted, and its tokens are counted
    assert done.outcome is Outcome.SUCCEEDED
    assert _requests_with(openai_stub, admitted) == 1
    used = stored_turn(first.turn_id).total_tokens
    assert used > 10
    assert _counter(redis_url, acme, _today())["tokens"] == used

    marker = f"refused-{uuid.uuid4().hex}"
    refused, result = _run(session, f"{marker} [words: 5]")
    assert result.outcome is Outcome.FAILED
    assert _requests_with(openai_stub, marker) == 0  # no model request was made
    turn = stored_turn(refused.turn_id)
    assert turn.status is TurnStatus.FAILED
    assert turn.error == (
        f"budget exceeded: tenant {acme} spent {used} tokens of its 10 tokens/day budget for {_today()} "
        "(CHATQ_TENANT_BUDGETS)"
    )
    assert turn.total_tokens == 0
    assert [m.role for m in turn_messages(refused.turn_id)] == ["user"]  # no reply, nothing partial
    events = replay_events(redis_url, refused.turn_id)
    assert [e["type"] for e in events] == ["error"]
    assert events[-1]["reason"] == BUDGET_EXCEEDED and events[-1]["error"] == turn.error
    announced = _announcements(redis_url, acme)
    assert len(announced) == 1 and announced[0]["type"] == BUDGET_EXCEEDED and announced[0]["exceeded"] is True

    again, _ = _run(session, "once more [words: 2]")  # refused again, announced once only
    assert stored_turn(again.turn_id).status is TurnStatus.FAILED
    assert len(_announcements(redis_url, acme)) == 1

    # Another tenant's turn runs on the same worker.
    served, result = _run(create_session(model="gpt-4o-mini", tenant=other), "other [words: 3]")
    assert result.outcome is Outcome.SUCCEEDED and stored_turn(served.turn_id).status is TurnStatus.SUCCEEDED


@pytest.mark.parametrize("framework", ["langgraph", "plain_openai"])
def test_a_running_turn_stops_at_its_next_step_with_its_finished_steps_kept(
    budgets: dict[str, str], openai_stub: OpenAIStub, redis_url: str, framework: str
) -> None:
    acme = _tenant()
    _configure(f"{acme}=1000000tokens/day")
    # Other turns (another worker's) spent all but a few tokens: this turn is admitted, and its
    # first model step brings the spend past the budget.
    client = redis.Redis.from_url(redis_url)
    client.hset(budget_key(acme, _today()), mapping={"tokens": 999_990, "micro_usd": 0})
    client.close()
    session = create_session(framework=framework, model="gpt-4o-mini", tenant=acme)
    marker = f"steps-{uuid.uuid4().hex}"
    request, result = _run(session, f'{marker} [rounds: 3 calculator {{"expression": "1+1"}}]')

    assert result.outcome is Outcome.FAILED
    assert _requests_with(openai_stub, marker) == 1  # stopped before the tool and the next request
    turn = stored_turn(request.turn_id)
    assert turn.status is TurnStatus.FAILED and turn.error is not None
    assert turn.error.startswith(f"budget exceeded: tenant {acme} spent ")
    with session_scope() as db:
        steps = read_steps(db.connection(), request.turn_id)
    assert [step.kind for step in steps] == [StepKind.MODEL]  # the finished step is kept
    step_tokens = int((steps[0].usage or {})["total_tokens"])
    assert step_tokens > 10
    assert turn.total_tokens == step_tokens  # its usage is stored, so Postgres counts it
    assert _counter(redis_url, acme, _today())["tokens"] == 999_990 + step_tokens
    events = replay_events(redis_url, request.turn_id)
    assert events[0]["type"] == "started" and events[-1]["type"] == "error"
    assert events[-1]["reason"] == BUDGET_EXCEEDED
    assert len(_announcements(redis_url, acme)) == 1


def test_the_counter_is_reseeded_from_postgres_when_redis_lost_it(
    budgets: dict[str, str], openai_stub: OpenAIStub, redis_url: str
) -> None:
    acme = _tenant()
    _configure(f"{acme}=5usd/month", prices=PRICES)
    session = create_session(model="gpt-4o-mini", tenant=acme)
    first, _ = _run(session, "one [words: 4]")
    second, _ = _run(session, "two [words: 7]")
    rows = [stored_turn(first.turn_id), stored_turn(second.turn_id)]
    tokens = sum(row.total_tokens for row in rows)
    micros = sum(-(-(row.prompt_tokens * 1 + row.completion_tokens * 2) // 1) for row in rows)
    month = period_key(get_settings().tenant_budgets[0].period, datetime.now(UTC))
    counted = _counter(redis_url, acme, month)
    assert (counted["tokens"], counted["micro_usd"]) == (tokens, micros)

    client = redis.Redis.from_url(redis_url)
    client.delete(budget_key(acme, month))
    client.close()
    settings = get_settings()
    ledger = ledger_of(settings, build_runtime().redis, build_runtime().engine)
    spend = ledger.spend(acme, settings.tenant_budgets[0])
    assert (spend.tokens, spend.micro_usd) == (tokens, micros)
    assert spend.spent == Decimal(micros) / 1_000_000 and not spend.exceeded
    assert _counter(redis_url, acme, month)["tokens"] == tokens  # written back to Redis


def test_chatq_usage_shows_spend_against_each_budget(chatq_env: dict[str, str]) -> None:
    acme, beta, spare = _tenant(), _tenant(), _tenant()
    for tenant, prompt, completion in ((acme, 3_000_000, 1_000_000), (beta, 400, 100)):
        session_id = create_session(model="gpt-4o-mini", tenant=tenant)
        ref = add_turn(session_id, [user("q"), assistant("a")])
        with session_scope() as db:
            db.execute(
                update(Turn)
                .where(Turn.id == ref.id)
                .values(
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    total_tokens=prompt + completion,
                    finished_at=datetime.now(UTC),
                )
            )
    with session_scope() as db:
        assert db.execute(select(ChatSession.id).where(ChatSession.tenant == acme)).first() is not None
    env = {**chatq_env, "CHATQ_PRICES": PRICES, "CHATQ_TENANT_BUDGETS": f"{acme}=4usd/day,*=1000tokens/month"}
    shown = chatq_here(env, "usage")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert ["tenant", "budget", "period", "spent", "left"] in lines
    assert [acme, "$4/day", _today(), "$5.000000", "$0.000000", "SPENT"] in lines
    assert [beta, "1000", "tokens/month", _today()[:7], "500", "tokens", "500", "tokens"] in lines

    narrowed = json.loads(chatq_here(env, "usage", "--tenant", spare, "--json").stdout)
    assert narrowed["budgets"] == [
        {
            "tenant": spare,
            "budget": 1000.0,
            "unit": "tokens",
            "period": "month",
            "period_start": _today()[:7],
            "spent": 0.0,
            "left": 1000.0,
            "tokens": 0,
            "exceeded": False,
        }
    ]
    mine = json.loads(chatq_here(env, "usage", "--tenant", acme, "--json").stdout)["budgets"][0]
    assert (mine["spent"], mine["left"], mine["exceeded"]) == (5.0, 0.0, True)


def test_turns_one_after_another_go_over_the_budget_by_at_most_one_turn(
    budgets: dict[str, str], openai_stub: OpenAIStub, redis_url: str
) -> None:
    acme = _tenant()
    _configure(f"{acme}=1000tokens/day")
    session = create_session(model="gpt-4o-mini", tenant=acme)
    prices: list[int] = []
    for number in range(40):
        request, result = _run(session, f"turn {number} [words: 30]")
        if result.outcome is Outcome.FAILED:
            break
        prices.append(stored_turn(request.turn_id).total_tokens)
    else:
        pytest.fail("no turn was refused")
    spent = sum(prices)
    assert spent >= 1000  # the last turn admitted brought the spend to the budget...
    assert spent - prices[-1] < 1000  # ...from below it, so the overshoot is at most that one turn
    assert _counter(redis_url, acme, _today())["tokens"] == spent


def test_turns_on_several_workers_at_once_go_over_the_budget_by_at_most_one_turn(
    budgets: dict[str, str], openai_stub: OpenAIStub, redis_url: str
) -> None:
    """Eight workers (threads, each with its own session of the tenant) submit turns until refused:
    near the budget they take turns, so the tenant ends at most one turn's price over it."""
    acme = _tenant()
    _configure(f"{acme}=1500tokens/day")
    prices: list[int] = []
    waits: list[int] = []
    lock = threading.Lock()

    def work(number: int) -> None:
        session = create_session(model="gpt-4o-mini", tenant=acme)
        request = None
        for _ in range(200):
            if request is None:
                request = parse_turn_request(
                    {"session_id": str(session), "content": f"worker {number} [words: 40]"},
                    task_id=str(uuid.uuid4()),
                    settings=get_settings(),
                )
            result = execute_turn(request, queue=INTERACTIVE_QUEUE, worker=f"w{number}", runtime=build_runtime())
            if result.outcome is Outcome.WAITING:
                with lock:
                    waits.append(number)
                time.sleep(result.retry_after or 0.1)
                continue
            if result.outcome is Outcome.FAILED:
                return
            assert result.outcome is Outcome.SUCCEEDED, result
            with lock:
                prices.append(stored_turn(request.turn_id).total_tokens)
            request = None

    threads = [threading.Thread(target=work, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    spent = sum(prices)
    assert spent >= 1500 and waits  # they reached the budget, and some waited near it
    assert spent - 1500 <= max(prices), (spent, prices)
    assert _counter(redis_url, acme, _today())["tokens"] == spent


def test_the_gate_runs_turns_alone_until_a_price_is_known_then_side_by_side(
    budgets: dict[str, str], openai_stub: OpenAIStub
) -> None:
    acme = _tenant()
    _configure(f"{acme}=5usd/day")  # no CHATQ_PRICES: its turns cost $0, a price known once one ended
    settings = get_settings()
    budget = settings.tenant_budgets[0]
    runtime = build_runtime()
    ledger = ledger_of(settings, runtime.redis, runtime.engine)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert ledger.admit(acme, budget, turn_id=first, seconds=60)[0] is Gate.ADMIT
    assert ledger.admit(acme, budget, turn_id=second, seconds=60)[0] is Gate.WAIT  # no price known yet
    ledger.release(acme, first)
    assert ledger.admit(acme, budget, turn_id=second, seconds=60)[0] is Gate.ADMIT  # alone again
    ledger.release(acme, second)

    _, done = _run(create_session(model="gpt-4o-mini", tenant=acme), "priced at zero [words: 3]")
    assert done.outcome is Outcome.SUCCEEDED
    # Its price ($0) is known now: turns start side by side, never held for a budget they cannot reach.
    gates = [ledger.admit(acme, budget, turn_id=uuid.uuid4(), seconds=60)[0] for _ in range(5)]
    assert gates == [Gate.ADMIT] * 5
    # A lapsed admission (its worker died) stops counting as running.
    lapsed = _tenant()
    assert ledger.admit(lapsed, budget, turn_id=uuid.uuid4(), seconds=0.2)[0] is Gate.ADMIT
    time.sleep(0.3)
    assert ledger.admit(lapsed, budget, turn_id=uuid.uuid4(), seconds=60)[0] is Gate.ADMIT

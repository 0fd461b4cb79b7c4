"""Durable steps (issue 28) with real workers: a turn of four tool rounds interrupted while its third
model request is in flight resumes after its finished steps, whatever interrupted it.

Four scenarios share a relay of workers (tests/faults/durable.py): the turns of a scenario run on one
worker (the victim), its successor is launched once the victim holds them all, and the fault hands them over:

- kill -9 of the victim's whole process group (takeover once the lease runs out, by the
  successor's own sweep), with two more turns cut off in the middle of a tool call: one of a tool
  not safe to repeat, one of a repeatable tool;
- SIGTERM: the victim hands its turns back at once;
- lease expiry: the victim is frozen (SIGSTOP), its lease runs out and the successor takes over;
  then it is thawed (SIGCONT) and its stale attempts must not write anything;
- an `AgentInvocationError` on the third request (the retry resumes; tests/integration/durable
  proves the same in-process in more detail).

Each case is compared with a fault-free run of the same turn on the same workers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.durable import (
    FRAMEWORKS,
    IN_FLIGHT,
    SLOTS,
    Case,
    Relay,
    assert_repeated,
    assert_resumed,
    assert_unknown_outcome,
    requests_of,
    submit_call,
    submit_rounds,
    wait_until,
)
from tests.faults.helpers import Worker, Workers, wait_finished
from tests.support.effects import EFFECT, EFFECT_REPEATABLE, effect_tools, lines
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events

pytestmark = pytest.mark.slow

HOLD = 15.0
"""Seconds a held model request or tool call stays in flight: far longer than it takes the test to
act, shorter than CHATQ_TURN_TIMEOUT (a fault that never came would show as a failed turn)."""
STALL = 4.0
"""Lease expiry: the held request or call ends while its worker is frozen, so the thawed stale
attempt goes on at once to record its step (and is refused)."""
TAKEOVER = 60.0
"""Generous bound for a scenario's turns to finish after the fault, on a loaded machine."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """The turns of one fault and the workers it went between."""

    cases: dict[str, Case]
    """By name: a framework (a turn of four rounds), or `unsafe` / `repeatable` (one held tool call)."""
    victim: Worker
    """The worker the fault hit."""
    successor: Worker
    """The worker that finished the turns."""


@pytest.fixture(scope="module", autouse=True)
def _effects() -> Iterator[None]:
    """The side-effect tools exist in this process too: sessions name them (workers load them as a plugin)."""
    with effect_tools():
        yield


@pytest.fixture(scope="module")
def relay(worker_env: dict[str, str]) -> Iterator[Relay]:
    pool = Workers(worker_env)
    try:
        yield Relay(pool)
    finally:
        pool.kill_all()
        print(pool.logs())  # shown only when a test failed


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("effects")


@pytest.fixture(scope="module")
def uninterrupted(relay: Relay, tmp: Path) -> dict[str, Case]:
    """The fault-free run of the four-round turn, per framework."""
    relay.victim()
    cases = {framework: submit_rounds(framework, tmp) for framework in FRAMEWORKS}
    rows = wait_finished([case.turn_id for case in cases.values()], timeout=TAKEOVER)
    assert {row.status.value for row in rows.values()} == {"succeeded"}, [row.error for row in rows.values()]
    return cases


def _in_position(relay: Relay, cases: dict[str, Case], stub: OpenAIStub) -> None:
    """Wait until every four-round case's third request and every tool case's call is in flight."""

    def ready() -> bool:
        return all(
            lines(case.path) if name in ("unsafe", "repeatable") else len(requests_of(stub, case)) >= IN_FLIGHT
            for name, case in cases.items()
        )

    wait_until(ready, "the turns did not reach their held request or call", timeout=30, logs=relay.pool.logs)


def _finish(cases: dict[str, Case]) -> None:
    wait_finished([case.turn_id for case in cases.values()], timeout=TAKEOVER)


def _abandoned(worker: Worker, case: Case) -> bool:
    """The worker's log says it gave up its attempt of the case's turn (its lease was lost)."""
    return any(str(case.turn_id) in line and "lease lost" in line for line in worker.log().splitlines())


@pytest.fixture(scope="module")
def killed(relay: Relay, uninterrupted: dict[str, Case], tmp: Path, openai_stub: OpenAIStub) -> Scenario:
    """kill -9 of the victim's whole process group while every turn is held mid-request or mid-call."""
    victim = relay.victim()
    cases = {framework: submit_rounds(framework, tmp, hold_at=IN_FLIGHT, hold=HOLD) for framework in FRAMEWORKS}
    cases["unsafe"] = submit_call("langgraph", EFFECT, tmp, hold=HOLD)
    cases["repeatable"] = submit_call("plain_openai", EFFECT_REPEATABLE, tmp, hold=HOLD)
    assert len(cases) == SLOTS
    successor = relay.successor(cases)
    _in_position(relay, cases, openai_stub)
    victim.kill()
    relay.hand_over(successor.wait_ready())
    _finish(cases)
    return Scenario(cases=cases, victim=victim, successor=successor)


@pytest.fixture(scope="module")
def handed_back(relay: Relay, uninterrupted: dict[str, Case], tmp: Path, openai_stub: OpenAIStub) -> Scenario:
    """SIGTERM of the victim while every turn's third request is in flight: it hands them back."""
    victim = relay.victim()
    cases = {framework: submit_rounds(framework, tmp, hold_at=IN_FLIGHT, hold=HOLD) for framework in FRAMEWORKS}
    successor = relay.successor(cases)
    _in_position(relay, cases, openai_stub)
    assert victim.stop(timeout=30) == 0, victim.log()[-3000:]
    relay.hand_over(successor.wait_ready())
    _finish(cases)
    return Scenario(cases=cases, victim=victim, successor=successor)


@pytest.fixture(scope="module")
def expired(relay: Relay, uninterrupted: dict[str, Case], tmp: Path, openai_stub: OpenAIStub) -> Scenario:
    """The victim frozen (SIGSTOP) until its lease ran out and the successor finished its turns,
    then thawed (SIGCONT): its stale attempts stop without writing, and it is stopped."""
    victim = relay.victim()
    cases = {framework: submit_rounds(framework, tmp, hold_at=IN_FLIGHT, hold=STALL) for framework in FRAMEWORKS}
    cases["unsafe"] = submit_call("plain_openai", EFFECT, tmp, hold=STALL)
    cases["repeatable"] = submit_call("langgraph", EFFECT_REPEATABLE, tmp, hold=STALL)
    assert len(cases) == SLOTS  # every slot busy: the frozen worker waits on no new message
    successor = relay.successor(cases)
    _in_position(relay, cases, openai_stub)
    assert victim.process is not None
    frozen_at = time.monotonic()
    os.killpg(victim.process.pid, signal.SIGSTOP)
    try:
        successor.wait_ready()
        _finish(cases)
        time.sleep(max(frozen_at + STALL + 0.5 - time.monotonic(), 0))
    finally:
        os.killpg(victim.process.pid, signal.SIGCONT)
    wait_until(
        lambda: all(_abandoned(victim, case) for case in cases.values()),
        "the thawed worker did not give up its stale attempts",
        timeout=30,
        logs=relay.pool.logs,
    )
    relay.hand_over(successor)
    assert victim.stop(timeout=30) == 0, victim.log()[-3000:]
    return Scenario(cases=cases, victim=victim, successor=successor)


@pytest.fixture(scope="module")
def retried(relay: Relay, uninterrupted: dict[str, Case], tmp: Path) -> dict[str, Case]:
    """The third model request fails (HTTP 500: `AgentInvocationError`); the one retry resumes."""
    relay.victim()
    cases = {framework: submit_rounds(framework, tmp, fail_at=IN_FLIGHT) for framework in FRAMEWORKS}
    _finish(cases)
    return cases


def _ran_on(scenario: Scenario, name: str) -> None:
    row_worker = wait_finished([scenario.cases[name].turn_id], timeout=1)[scenario.cases[name].turn_id].worker
    assert row_worker is not None and row_worker.startswith(scenario.successor.hostname_prefix)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_kill_9_in_the_third_model_request_resumes_after_the_finished_steps(
    framework: str, killed: Scenario, uninterrupted: dict[str, Case], openai_stub: OpenAIStub, redis_url: str
) -> None:
    events = assert_resumed(killed.cases[framework], uninterrupted[framework], openai_stub, redis_url, attempts=2)
    _ran_on(killed, framework)
    assert "previous worker stopped" in next(e["error"] for e in events if e["type"] == "retry")


@pytest.mark.timeout(180)
def test_kill_9_in_a_call_of_a_tool_not_safe_to_repeat_fails_the_turn_naming_the_call(
    killed: Scenario, redis_url: str
) -> None:
    assert_unknown_outcome(killed.cases["unsafe"], EFFECT, redis_url)
    _ran_on(killed, "unsafe")


@pytest.mark.timeout(180)
def test_kill_9_in_a_call_of_a_repeatable_tool_repeats_it_with_the_same_key(killed: Scenario, redis_url: str) -> None:
    assert_repeated(killed.cases["repeatable"], redis_url)
    _ran_on(killed, "repeatable")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sigterm_in_the_third_model_request_hands_back_and_resumes(
    framework: str, handed_back: Scenario, uninterrupted: dict[str, Case], openai_stub: OpenAIStub, redis_url: str
) -> None:
    # A hand-back is not a failed invocation: the turn stays on its first attempt.
    events = assert_resumed(handed_back.cases[framework], uninterrupted[framework], openai_stub, redis_url, attempts=1)
    _ran_on(handed_back, framework)
    assert "shutting down" in next(e["error"] for e in events if e["type"] == "retry")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_lease_expiry_in_the_third_model_request_resumes_and_the_stale_attempt_writes_nothing(
    framework: str, expired: Scenario, uninterrupted: dict[str, Case], openai_stub: OpenAIStub, redis_url: str
) -> None:
    # Checked after the stale attempt ran on: nothing of it was stored, journaled or streamed.
    assert_resumed(expired.cases[framework], uninterrupted[framework], openai_stub, redis_url, attempts=2)
    _ran_on(expired, framework)


@pytest.mark.timeout(180)
def test_lease_expiry_in_tool_calls_the_stale_attempt_cannot_record_their_results(
    expired: Scenario, redis_url: str
) -> None:
    assert_unknown_outcome(expired.cases["unsafe"], EFFECT, redis_url)
    assert_repeated(expired.cases["repeatable"], redis_url)
    _ran_on(expired, "repeatable")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_agent_invocation_error_in_the_third_request_is_retried_from_the_finished_steps(
    framework: str, retried: dict[str, Case], uninterrupted: dict[str, Case], openai_stub: OpenAIStub, redis_url: str
) -> None:
    events = assert_resumed(retried[framework], uninterrupted[framework], openai_stub, redis_url, attempts=2)
    assert "resumed_after" in next(e for e in events if e["type"] == "retry")
    assert [e["type"] for e in replay_events(redis_url, retried[framework].turn_id)].count("started") == 2

"""The retry policy (worker.runtime.policy.retry): one decision for every cause a turn is delivered again."""

from __future__ import annotations

import dataclasses

import pytest

from chatq.settings import get_settings
from tests.support.env import environ
from worker.runtime.policy.retry import RetryCause, RetryDecision, RetryPolicy


def test_the_agent_failing_is_retried_until_the_last_attempt_then_given_up() -> None:
    policy = RetryPolicy(max_attempts=3, agent_delay=2.5)
    assert policy.after_agent_failure(1) == RetryDecision(cause=RetryCause.AGENT_FAILURE, retry=True, delay=2.5)
    assert policy.after_agent_failure(2).retry
    assert policy.after_agent_failure(3) == RetryDecision(cause=RetryCause.AGENT_FAILURE, retry=False, delay=0.0)
    assert not policy.after_agent_failure(4).retry  # a stray late attempt does not get another


def test_a_single_attempt_is_never_retried() -> None:
    assert not RetryPolicy(max_attempts=1).after_agent_failure(1).retry


def test_outages_back_off_exponentially_to_a_cap_and_never_give_up() -> None:
    policy = RetryPolicy()
    delays = [policy.after_outage(retries).delay for retries in range(8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert all(policy.after_outage(retries).retry for retries in (0, 10, 10_000))
    assert policy.after_outage(10_000).cause is RetryCause.OUTAGE
    assert policy.after_outage(-1).delay == 1.0  # a nonsense counter still gets the first step


def test_a_busy_session_is_looked_at_again_just_after_the_lease_runs_out() -> None:
    policy = RetryPolicy(busy_margin=0.5)
    assert policy.when_busy(3.0) == RetryDecision(cause=RetryCause.BUSY, retry=True, delay=3.5)
    assert policy.when_busy(None).delay == 0.5
    assert policy.when_busy(-2.0).delay == 0.5  # a lease already past is checked at once


def test_the_policy_comes_from_the_settings() -> None:
    with environ(CHATQ_MAX_ATTEMPTS="4", CHATQ_RETRY_DELAY="0.25"):
        policy = RetryPolicy.from_settings(get_settings())
    assert (policy.max_attempts, policy.agent_delay) == (4, 0.25)
    assert policy.after_agent_failure(3).retry and not policy.after_agent_failure(4).retry


def test_policies_and_decisions_are_frozen_values() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().max_attempts = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        RetryPolicy(3)  # type: ignore[misc]  # keyword-only


def test_a_busy_provider_is_waited_out_as_it_asks_with_jitter_until_patience_runs_out() -> None:
    policy = RetryPolicy(provider_patience=60.0, provider_jitter=0.2)
    asked = policy.when_provider_busy(5.0, refusals=1, busy_for=0.0, jitter=0.0)
    assert asked == RetryDecision(cause=RetryCause.PROVIDER, retry=True, delay=5.0)
    assert policy.when_provider_busy(5.0, refusals=1, busy_for=0.0, jitter=0.999).delay == pytest.approx(6.0, 0.01)
    # Not said: back off per refusal of the turn, to a cap.
    unsaid = [policy.when_provider_busy(None, refusals=n, busy_for=0.0, jitter=0.0).delay for n in range(1, 9)]
    assert unsaid == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert not policy.when_provider_busy(5.0, refusals=9, busy_for=56.0, jitter=0.0).retry


def test_waiting_for_a_slot_never_gives_up() -> None:
    decision = RetryPolicy().when_no_slot(120.0)
    assert decision == RetryDecision(cause=RetryCause.SLOT, retry=True, delay=120.0)


def test_patience_comes_from_the_settings() -> None:
    with environ(CHATQ_PROVIDER_PATIENCE="42"):
        assert RetryPolicy.from_settings(get_settings()).provider_patience == 42.0


def test_webhooks_back_off_from_the_first_delay_to_ten_minutes_for_about_an_hour() -> None:
    policy = RetryPolicy()  # the defaults: 5 s, doubling, for 3600 s
    elapsed, delays = 0.0, []
    attempts = 1
    while (decision := policy.after_webhook_attempt(attempts, elapsed)).retry:
        assert decision.cause is RetryCause.WEBHOOK
        delays.append(decision.delay)
        elapsed += decision.delay
        attempts += 1
    assert delays[:4] == [5.0, 10.0, 20.0, 40.0] and max(delays) == 600.0
    assert 3000 < elapsed <= 3600  # given up within the window, after most of it
    assert not policy.after_webhook_attempt(2, 3599.0).retry


def test_the_webhook_window_and_first_delay_come_from_the_settings() -> None:
    with environ(CHATQ_WEBHOOK_BACKOFF="0.5", CHATQ_WEBHOOK_RETRY_FOR="3"):
        policy = RetryPolicy.from_settings(get_settings())
    assert (policy.webhook_base, policy.webhook_window) == (0.5, 3.0)
    assert [policy.after_webhook_attempt(n, 0.0).delay for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert not policy.after_webhook_attempt(3, 1.5).retry

"""The shared limits' Redis scripts (worker.runtime.policy.limits), against the test run's real Redis."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from worker.events import get_redis
from worker.runtime.policy import limits
from worker.runtime.policy.limits import Scope


@pytest.fixture
def scope_key(chatq_env: dict[str, str]) -> Iterator[str]:
    key = f"test-{uuid.uuid4().hex[:8]}@http://stub/v1"
    yield key
    client = get_redis()
    client.delete(*Scope(key=key, model="m").keys(), *Scope(key=key, model="m").share_keys())


def _take(scope: Scope, member: str, *, interactive: bool = False, lease: float = 30.0) -> limits.Grant:
    return limits.acquire(get_redis(), scope, member, interactive=interactive, hint_tokens=100, lease_seconds=lease)


def test_a_concurrency_limit_hands_out_its_slots_and_takes_them_back(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m", max_concurrent=2)
    assert _take(scope, "a").granted and _take(scope, "b").granted
    refused = _take(scope, "c")
    assert not refused.granted and refused.reason == "concurrency" and refused.wait > 0
    assert limits.state(get_redis(), scope).in_flight == 2
    limits.release(get_redis(), scope, "a", succeeded=True, seconds=0.5, estimate=100, tokens=80)
    assert _take(scope, "c").granted
    # The same turn asking again (a redelivery) does not take a second slot.
    assert _take(scope, "c").granted and limits.state(get_redis(), scope).in_flight == 2


def test_a_slot_whose_holder_died_comes_back_when_its_lease_lapses(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m", max_concurrent=1)
    assert _take(scope, "dead-worker", lease=0.3).granted
    assert not _take(scope, "next").granted
    deadline = time.monotonic() + 10
    while not (grant := _take(scope, "next")).granted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert grant.granted


def test_a_rate_limit_spaces_waiting_batch_turns_one_interval_apart(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m", rpm=600)  # one request per 100 ms, a 500 ms burst
    granted = [_take(scope, f"t{i}").granted for i in range(5)]
    assert all(granted)
    waits = [_take(scope, f"w{i}") for i in range(6)]
    assert not any(w.granted for w in waits) and {w.reason for w in waits} == {"rpm"}
    gaps = [later.wait - earlier.wait for earlier, later in itertools.pairwise(waits)]
    assert all(0.09 <= gap <= 0.11 for gap in gaps), gaps


def test_a_waiting_interactive_turn_goes_before_batch_turns(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m", max_concurrent=1)
    assert _take(scope, "running").granted
    interactive = _take(scope, "interactive", interactive=True)
    assert not interactive.granted
    limits.release(get_redis(), scope, "running", succeeded=True, seconds=1.0, estimate=100, tokens=100)
    # The slot is free, but an interactive turn is waiting for it: batch turns wait behind it.
    batch = _take(scope, "batch")
    assert not batch.granted and batch.reason == "interactive"
    assert _take(scope, "interactive", interactive=True).granted
    limits.release(get_redis(), scope, "interactive", succeeded=True, seconds=1.0, estimate=100, tokens=100)
    assert _take(scope, "batch").granted


def test_a_429_lowers_the_adaptive_limit_and_successes_raise_it(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m")
    assert limits.state(get_redis(), scope).rpm == 0  # unlimited until the service says otherwise
    # A refusal at a trickle says nothing about the fleet's rate.
    assert limits.throttled(get_redis(), scope, kind="rate_limited", limit_requests=None, limit_tokens=None).rpm == 0
    for i in range(20):
        assert _take(scope, f"t{i}").granted
    # The service names its limit: the fleet goes to 95% of it.
    after = limits.throttled(get_redis(), scope, kind="rate_limited", limit_requests=300, limit_tokens=None)
    assert after.rpm == pytest.approx(285)
    for i in range(20):
        limits.release(get_redis(), scope, f"t{i}", succeeded=True, seconds=0.2, estimate=100, tokens=100)
    raised = limits.state(get_redis(), scope).rpm
    assert 285 < raised <= 0.97 * 300


def test_without_a_named_limit_a_429_cuts_rate_and_concurrency_by_beta(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m")
    for i in range(10):
        assert _take(scope, f"t{i}").granted
    after = limits.throttled(get_redis(), scope, kind="rate_limited", limit_requests=None, limit_tokens=None)
    assert after.rpm == pytest.approx(limits.BETA * 10 * 6)  # 10 requests in the last 10 s
    assert 1 <= after.max_concurrent < 10
    # One burst of refusals lowers the limit once, not once per refused request.
    again = limits.throttled(get_redis(), scope, kind="rate_limited", limit_requests=None, limit_tokens=None)
    assert again.rpm == after.rpm


def test_the_batch_bar_says_when_the_provider_holds_turns_back(scope_key: str) -> None:
    from worker.cli.batch_cli import provider_note

    model = scope_key.partition("@")[0]
    now = time.time()
    try:
        limits.mark_held(get_redis(), model, "rate_limited", now - 1)
        assert model not in provider_note(now), "a hold that is over is not shown"
        limits.mark_held(get_redis(), model, "rate_limited", now + 30)
        assert f"held back by the provider ({model}: 429 rate limited, until " in provider_note(now)
    finally:
        get_redis().hdel(limits.HELD_KEY, model)


def test_a_token_limit_charges_an_estimate_and_corrects_it_from_the_reported_usage(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m", tpm=6000)  # 100 tokens a second
    first = _take(scope, "a")  # 100 tokens estimated (the hint): one second's worth
    assert first.granted and first.estimate == 100
    refused = _take(scope, "b")
    assert not refused.granted and refused.reason == "tpm" and 0.5 < refused.wait <= 1.0
    # The reply used 10 tokens, not 100: the 90 charged too many are given back, and the model's
    # estimate follows what it really uses.
    limits.release(get_redis(), scope, "a", succeeded=True, seconds=0.2, estimate=first.estimate, tokens=10)
    second = _take(scope, "b")
    assert second.granted and second.estimate == 10


def test_a_window_of_429s_holds_every_sender_until_the_reset_and_keeps_the_named_limit(scope_key: str) -> None:
    # Issue 34: a provider allowing N requests per window. The burst spends the window; every
    # refusal names the limit (120 per minute) and says when the window frees. The fleet must wait
    # for that all together, and must not lower its rate from what it sent while it waited.
    scope = Scope(key=scope_key, model="m")
    for i in range(20):
        assert _take(scope, f"t{i}").granted
    first = limits.throttled(
        get_redis(), scope, kind="rate_limited", limit_requests=120, limit_tokens=None, retry_after=1.5
    )
    assert first.rpm == pytest.approx(114)
    # Nobody goes before the reset: batch turns come back from it one interval (60 / 114 s) apart.
    waits = [_take(scope, f"w{i}") for i in range(4)]
    assert {w.reason for w in waits} == {"rate_limited"} and not any(w.granted for w in waits)
    assert 1.3 <= waits[0].wait <= 1.5
    gaps = [later.wait - earlier.wait for earlier, later in itertools.pairwise(waits)]
    assert all(0.5 <= gap <= 0.56 for gap in gaps), gaps
    interactive = _take(scope, "me", interactive=True)
    assert not interactive.granted and interactive.reason == "rate_limited" and 1.3 <= interactive.wait <= 1.5
    # More refusals of requests that were in flight, during the hold and just after it, over a
    # longer span than the one-burst debounce: the limit stays what the service named.
    for _ in range(3):
        time.sleep(0.6)
        again = limits.throttled(
            get_redis(), scope, kind="rate_limited", limit_requests=120, limit_tokens=None, retry_after=0.2
        )
        assert again.rpm == pytest.approx(114)
    time.sleep(0.25)  # the last refusal's reset
    assert _take(scope, "me", interactive=True).granted


def test_a_rate_measured_while_the_fleet_held_back_lowers_nothing(scope_key: str) -> None:
    scope = Scope(key=scope_key, model="m")
    for i in range(10):
        assert _take(scope, f"t{i}").granted
    # No limit named: 15% below the rate really sent (10 requests in the last 10 s).
    first = limits.throttled(
        get_redis(), scope, kind="rate_limited", limit_requests=None, limit_tokens=None, retry_after=1.0
    )
    assert first.rpm == pytest.approx(limits.BETA * 60)
    time.sleep(1.2)  # the hold is over, and so is the one-burst debounce
    # Another refusal right after the hold: the 10 s behind it were mostly spent waiting, so the
    # rate "sent" over them says nothing about what the service allows.
    again = limits.throttled(
        get_redis(), scope, kind="rate_limited", limit_requests=None, limit_tokens=None, retry_after=1.0
    )
    assert again.rpm == pytest.approx(first.rpm)


def test_interactive_turns_waiting_for_a_slot_come_back_about_once(scope_key: str) -> None:
    # Two slots, eight interactive turns at once, each holding its slot 0.3 s: a waiting turn is
    # told when the slot its place in line gets frees, instead of asking again every avg / slots.
    scope = Scope(key=scope_key, model="m", max_concurrent=2)
    for i in range(3):  # the scope's history: a request takes about 0.3 s
        assert _take(scope, f"warm{i}").granted
        limits.release(get_redis(), scope, f"warm{i}", succeeded=True, seconds=0.3, estimate=100, tokens=100)
    asks: dict[str, int] = {}

    def turn(name: str) -> None:
        while True:
            asks[name] = asks.get(name, 0) + 1
            grant = _take(scope, name, interactive=True)
            if grant.granted:
                started = time.monotonic()
                time.sleep(0.3)
                limits.release(
                    get_redis(),
                    scope,
                    name,
                    succeeded=True,
                    seconds=time.monotonic() - started,
                    estimate=100,
                    tokens=100,
                )
                return
            time.sleep(grant.wait)

    threads = [threading.Thread(target=turn, args=(f"i{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(asks) == 8 and not any(thread.is_alive() for thread in threads)
    # 6 of the 8 had to wait; before, they asked 4 times each on average and the last 8 times.
    waited = sorted(asks.values())
    assert sum(waited) <= 8 + 6 * 2, waited
    assert max(waited) <= 4, waited


def test_a_fair_share_yield_under_a_concurrency_limit_comes_back_after_a_slots_turn(scope_key: str) -> None:
    # A concurrency scope's slots free about max_concurrent per request time, full or not: a turn
    # that yields a free slot to a tenant behind its share is spaced that far (it came back after
    # 1 ms and churned when the step was that of a full scope only).
    scope = Scope(key=scope_key, model="m", max_concurrent=4)

    def ask(member: str, tenant: str) -> limits.Grant:
        return limits.acquire(
            get_redis(), scope, member, interactive=False, hint_tokens=1, lease_seconds=30, tenant=tenant
        )

    for i in range(3):  # a request takes 0.4 s: a slot frees every 0.1 s
        assert ask(f"w{i}", "a").granted
        limits.release(get_redis(), scope, f"w{i}", succeeded=True, seconds=0.4, estimate=1, tokens=0)
    for i in range(4):
        assert ask(f"a{i}", "a").granted
    assert ask("b0", "b").reason == "concurrency"  # b waits in line now
    limits.release(get_redis(), scope, "a0", succeeded=True, seconds=0.4, estimate=1, tokens=0)
    yielded = ask("a4", "a")  # a free slot, but a is ahead of b: it yields it
    assert not yielded.granted and yielded.reason == "fair_share"
    assert 0.08 <= yielded.wait <= 0.5, yielded.wait

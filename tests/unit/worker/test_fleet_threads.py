"""The fleet's threads (worker.runtime.policy.threads): the count is the sum of the live entries."""

from __future__ import annotations

from worker.runtime.policy import threads


def test_the_fleets_threads_are_the_sum_of_the_entries_not_expired() -> None:
    entries = {b"celery-1@a": b"8 2000", "celery-2@a": "8 2000", b"celery-1@b": b"16 2001"}
    assert threads.live_threads(entries, 1000) == (32, [])
    # At 2000 ms the first two have expired (killed workers that stopped refreshing them).
    assert threads.live_threads(entries, 2000) == (16, ["celery-1@a", "celery-2@a"])
    assert threads.live_threads({}, 0) == (0, [])


def test_an_entry_that_cannot_be_read_counts_nothing_and_is_dropped() -> None:
    assert threads.live_threads({b"x@h": b"eight", b"y@h": b"4", b"z@h": b"4 9000"}, 1000) == (4, ["x@h", "y@h"])


def test_the_threads_scope_is_a_pool_that_shares_and_never_refuses_for_concurrency() -> None:
    scope = threads.threads_scope(16)
    assert scope.pool and scope.max_concurrent == 16 and scope.model == "threads"
    assert scope.keys()[0] == "chatq:limits:threads@fleet"


def test_the_weights_go_to_the_script_with_the_default_last() -> None:
    from chatq.tenant_weights import parse_tenant_weights
    from worker.runtime.policy.limits import encode_weights

    assert encode_weights(parse_tenant_weights("acme=3,beta=0.5")) == "acme=3.0,beta=0.5,*=1.0"
    assert encode_weights(parse_tenant_weights("*=2")) == "*=2.0"

"""Weighted fair share between tenants under one shared limit (worker.runtime.policy.limits), against
the test run's real Redis: turns of several tenants ask for slots as the workers would, coming back
when told, and the grants each tenant receives are counted."""

from __future__ import annotations

import heapq
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from worker.events import get_redis
from worker.ops.metrics import ProviderLimitsCollector
from worker.runtime.policy import limits
from worker.runtime.policy.limits import Scope

RPM = 6000.0
"""One request per 10 ms: fast enough for a test, slow enough for Python's timers (the buckets
allow half a second's worth at once, so a late timer loses nothing)."""


@pytest.fixture
def scope(chatq_env: dict[str, str]) -> Iterator[Scope]:
    limited = Scope(key=f"fair-{uuid.uuid4().hex[:8]}@http://stub/v1", model="m", rpm=RPM)
    yield limited
    get_redis().delete(*limited.keys(), *limited.share_keys())


@dataclass
class Fleet:
    """Turns waiting to ask, as Celery's countdowns would bring them back."""

    scope: Scope
    weights: dict[str, float]
    interactive: bool = False
    due: list[tuple[float, int, str, str]] = field(default_factory=list)
    grants: list[tuple[float, str]] = field(default_factory=list)
    asks: int = 0
    _serial: int = 0

    def submit(self, tenant: str, count: int, at: float) -> None:
        for _ in range(count):
            self._serial += 1
            heapq.heappush(self.due, (at, self._serial, tenant, f"{tenant}-{self._serial}"))

    def run_until(self, end: float) -> None:
        while self.due and (now := time.monotonic()) < end:
            at, serial, tenant, member = self.due[0]
            if at > now:
                time.sleep(min(at - now, end - now, 0.005))
                continue
            heapq.heappop(self.due)
            self.asks += 1
            grant = limits.acquire(
                get_redis(),
                self.scope,
                member,
                interactive=self.interactive,
                hint_tokens=10,
                lease_seconds=30,
                tenant=tenant,
                weight=self.weights.get(tenant, 1.0),
            )
            if grant.granted:
                self.grants.append((time.monotonic(), tenant))
                limits.release(get_redis(), self.scope, member, succeeded=False, seconds=0.0, estimate=10, tokens=0)
            else:
                heapq.heappush(self.due, (time.monotonic() + grant.wait, serial, tenant, member))

    def received(self, start: float, end: float) -> Counter[str]:
        return Counter(tenant for at, tenant in self.grants if start <= at < end)


def _jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(value * value for value in values))


def test_backlogged_tenants_share_a_rate_limit_by_weight_whoever_came_first(scope: Scope) -> None:
    fleet = Fleet(scope=scope, weights={"a": 1.0, "b": 1.0, "c": 2.0})
    start = time.monotonic()
    fleet.submit("a", 600, start)  # a floods first: without fair share it holds the line for 6 s
    fleet.run_until(start + 0.6)
    fleet.submit("b", 150, time.monotonic())
    fleet.submit("c", 150, time.monotonic())
    joined = time.monotonic()
    fleet.run_until(joined + 2.5)
    got = fleet.received(joined + 0.5, joined + 2.5)  # after the new lines settle, all three backlogged
    assert sum(got.values()) >= 0.85 * 2.0 * RPM / 60, got  # the limit stays used
    normalised = [got[tenant] / weight for tenant, weight in fleet.weights.items()]
    assert _jain(normalised) >= 0.95, got
    assert got["c"] > 1.5 * got["b"], got


def test_a_tenant_arriving_behind_a_long_line_is_served_at_once(scope: Scope) -> None:
    fleet = Fleet(scope=scope, weights={})
    start = time.monotonic()
    fleet.submit("a", 400, start)
    fleet.run_until(start + 0.6)
    arrived = time.monotonic()
    fleet.submit("b", 5, arrived)
    fleet.run_until(arrived + 1.0)
    first_b = min(at for at, tenant in fleet.grants if tenant == "b")
    # Without fair share b's first turn would come back after a's 400 (4 s); it runs within a few intervals.
    assert first_b - arrived < 0.3
    assert fleet.received(arrived, arrived + 1.0)["b"] == 5
    shares = {share.tenant: share for share in limits.shares(get_redis(), scope)}
    assert shares["a"].yielded > 0 and shares["b"].granted == 5 and shares["a"].backlogged
    # The scrape reads the same fleet-wide figures from Redis.
    scraped = {
        (sample.name, sample.labels["tenant"]): sample.value
        for family in ProviderLimitsCollector(scopes=lambda: [scope]).collect()
        for sample in family.samples
        if "tenant" in sample.labels
    }
    assert scraped[("chatq_tenant_slots_total", "b")] == 5
    assert scraped[("chatq_tenant_slots_total", "a")] == shares["a"].granted
    assert scraped[("chatq_tenant_yields_total", "a")] == shares["a"].yielded > 0
    assert scraped[("chatq_tenant_backlogged", "a")] == 1


def test_an_idle_tenants_share_goes_to_the_others_at_once(scope: Scope) -> None:
    fleet = Fleet(scope=scope, weights={})
    start = time.monotonic()
    fleet.submit("a", 500, start)
    fleet.submit("b", 50, start + 0.2)
    fleet.run_until(start + 3.5)
    last_b = max(at for at, tenant in fleet.grants if tenant == "b")
    assert last_b < start + 2.0
    # Once b has nothing left, a's line runs at the whole rate (within the backlog grace and timer jitter).
    after = fleet.received(last_b + 1.2, start + 3.5)
    window = start + 3.5 - (last_b + 1.2)
    assert after["b"] == 0 and after["a"] >= 0.85 * window * RPM / 60, (after, window)


def test_a_single_tenant_is_paced_as_before_and_asks_about_once(scope: Scope) -> None:
    fleet = Fleet(scope=scope, weights={})
    start = time.monotonic()
    fleet.submit("a", 100, start)
    fleet.run_until(start + 5.0)
    assert len(fleet.grants) == 100
    # Each turn asked a couple of times at most (a turn back a little early waits the rest): no polling.
    assert fleet.asks <= 100 * 3, fleet.asks


def test_interactive_turns_are_shared_between_tenants_too(scope: Scope) -> None:
    fleet = Fleet(scope=scope, weights={"a": 1.0, "b": 1.0}, interactive=True)
    start = time.monotonic()
    fleet.submit("a", 400, start)  # a's interactive turns alone would hold the limit for 4 s
    fleet.run_until(start + 0.6)
    arrived = time.monotonic()
    fleet.submit("b", 100, arrived)
    fleet.run_until(arrived + 2.0)
    first_b = min(at for at, tenant in fleet.grants if tenant == "b")
    # In arrival order b's first turn would wait for a's 340 or so still waiting (3.4 s).
    assert first_b - arrived < 0.3, first_b - arrived
    got = fleet.received(arrived + 0.3, arrived + 1.5)  # both backlogged: b has 100 turns for 2 s at half the rate
    assert sum(got.values()) >= 0.85 * 1.2 * RPM / 60, got  # the limit stays used
    assert _jain([float(got["a"]), float(got["b"])]) >= 0.95, got
    shares = {share.tenant: share for share in limits.shares(get_redis(), scope)}
    assert shares["a"].yielded > 0 and shares["a"].backlogged


def test_batch_turns_still_wait_for_every_tenants_interactive_turns(scope: Scope) -> None:
    interactive = Fleet(scope=scope, weights={}, interactive=True)
    batch = Fleet(scope=scope, weights={})
    start = time.monotonic()
    interactive.submit("a", 60, start)
    interactive.submit("b", 60, start)
    interactive.run_until(start + 0.2)  # each has asked once: about 50 ran, the rest wait
    batch.submit("c", 50, time.monotonic())
    end = start + 2.5
    while time.monotonic() < end and (interactive.due or batch.due):
        interactive.run_until(min(end, time.monotonic() + 0.01))
        batch.run_until(min(end, time.monotonic() + 0.01))
    assert len(interactive.grants) == 120
    last_interactive = max(at for at, _ in interactive.grants)
    assert batch.grants and min(at for at, _ in batch.grants) > last_interactive - 0.05

"""The hook registry (worker.runtime.hooks): hooks are called in order, and one that raises breaks nothing."""

from __future__ import annotations

import logging
import uuid

import pytest

from chatq.settings import mask_secrets
from worker.ops.logs import LogHooks
from worker.ops.metrics import MetricsHooks
from worker.runtime import hooks
from worker.runtime.observers import get_hooks
from worker.runtime.retry import RetryCause

FACTS = hooks.Facts(turn_id=uuid.uuid4(), session_id=uuid.uuid4(), attempt=1, framework="none", model="echo")


class Recorder(hooks.TurnHooks):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def started(self, event: hooks.Started) -> None:
        self.calls.append(f"{self.name}.started")

    def ended(self, event: hooks.Ended) -> None:
        self.calls.append(f"{self.name}.ended:{event.outcome}")


class Broken(hooks.TurnHooks):
    def started(self, event: hooks.Started) -> None:
        raise RuntimeError("boom with https://user:hunter2@example.com/x")


def test_hooks_are_called_in_registration_order_at_each_point() -> None:
    calls: list[str] = []
    first, second = Recorder("a", calls), Recorder("b", calls)
    registry = hooks.HookRegistry([first])
    registry.add(second)
    assert registry.hooks == (first, second)
    registry.started(hooks.Started(turn=FACTS, deliveries=1))
    registry.ended(hooks.Ended(turn=FACTS, outcome="succeeded", seconds=0.1))
    assert calls == ["a.started", "b.started", "a.ended:succeeded", "b.ended:succeeded"]


def test_a_hook_that_raises_is_logged_masked_and_the_next_one_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    registry = hooks.HookRegistry([Broken(), Recorder("after", calls)])
    with caplog.at_level(logging.WARNING, logger="worker.runtime.hooks"):
        registry.started(hooks.Started(turn=FACTS, deliveries=1))  # does not raise
    assert calls == ["after.started"]
    [record] = [r for r in caplog.records if r.name == "worker.runtime.hooks"]
    assert "Broken.started raised, ignored" in record.getMessage()
    assert "hunter2" not in record.getMessage()
    assert record.getMessage() == mask_secrets(record.getMessage())


def test_added_registers_for_a_block_and_remove_takes_a_hook_out() -> None:
    calls: list[str] = []
    registry = hooks.HookRegistry()
    temporary = Recorder("t", calls)
    with registry.added(temporary):
        assert registry.hooks == (temporary,)
        registry.started(hooks.Started(turn=FACTS, deliveries=1))
    assert registry.hooks == ()
    registry.started(hooks.Started(turn=FACTS, deliveries=1))
    registry.remove(temporary)  # not registered: nothing happens
    assert calls == ["t.started"]


def test_points_a_hook_does_not_override_are_never_called_on_it() -> None:
    looked_up: list[str] = []

    class OnlyEnded(hooks.TurnHooks):
        def ended(self, event: hooks.Ended) -> None:
            pass

        def __getattribute__(self, name: str) -> object:
            looked_up.append(name)
            return super().__getattribute__(name)

    registry = hooks.HookRegistry([OnlyEnded()])
    registry.started(hooks.Started(turn=FACTS, deliveries=1))
    registry.ended(hooks.Ended(turn=FACTS, outcome="failed", seconds=0.0, error="x"))
    assert looked_up == ["ended"]  # a point nobody watches costs no call


def test_the_registry_offers_every_point_of_the_base_class() -> None:
    assert set(hooks.POINTS) == {
        "before_claim",
        "started",
        "first_text",
        "tool",
        "succeeded",
        "failed",
        "retried",
        "cancelled",
        "handed_back",
        "lost",
        "rejected",
        "ended",
    }
    for point in hooks.POINTS:
        assert getattr(hooks.HookRegistry, point) is not getattr(hooks.TurnHooks, point), point


def test_the_process_registry_is_built_once_with_metrics_then_logs() -> None:
    registry = get_hooks()
    assert registry is get_hooks()
    kinds = [type(hook) for hook in registry.hooks]
    assert kinds[:2] == [MetricsHooks, LogHooks]


def test_log_hooks_keep_the_runners_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="worker.runner"):
        registry = hooks.HookRegistry([LogHooks()])
        registry.started(hooks.Started(turn=FACTS, deliveries=1))
        registry.retried(hooks.Retried(turn=FACTS, cause=RetryCause.AGENT_FAILURE, delay=1.0, error="HTTP 500"))
        registry.succeeded(
            hooks.Succeeded(turn=FACTS, seconds=0.2, messages=1, prompt_tokens=3, completion_tokens=2, total_tokens=5)
        )
    prefix = f"turn {FACTS.turn_id} session {FACTS.session_id}: "
    assert [r.getMessage() for r in caplog.records if r.name == "worker.runner"] == [
        prefix + "attempt 1 started (framework none, model echo)",
        prefix + "attempt 1 failed, retrying: HTTP 500",
        prefix + "succeeded on attempt 1 (1 messages, 5 tokens)",
    ]


def test_payloads_are_frozen_and_keyword_only() -> None:
    with pytest.raises(TypeError):
        hooks.Started(FACTS, 1)  # type: ignore[misc]
    event = hooks.Started(turn=FACTS, deliveries=1)
    with pytest.raises(AttributeError):
        event.deliveries = 2  # type: ignore[misc]

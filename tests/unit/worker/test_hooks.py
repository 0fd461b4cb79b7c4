"""The hook registry (worker.runtime.observers.hooks): hooks are called in order, and one that raises breaks nothing."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid

import pytest
from prometheus_client import REGISTRY

from chatq.masking import mask_secrets
from worker.ops.logs import LogHooks
from worker.ops.metrics import MetricsHooks
from worker.runtime.observers import hook_points, hooks
from worker.runtime.policy.retry import RetryCause
from worker.wiring import get_hooks

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
    with caplog.at_level(logging.WARNING, logger="worker.runtime.observers.hooks"):
        registry.started(hooks.Started(turn=FACTS, deliveries=1))  # does not raise
    assert calls == ["after.started"]
    [record] = [r for r in caplog.records if r.name == "worker.runtime.observers.hooks"]
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
        "paused",
        "approval_waited",
        "lost",
        "rejected",
        "ended",
        "provider_admitted",
        "provider_refused",
        "slot_wait",
        "sweep_resent",
        "sweep_repaired",
        "schedule_fired",
        "webhook_attempt",
        "message_set_aside",
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


def _sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def test_the_counters_outside_a_turn_are_hook_points_that_the_metrics_hooks_keep() -> None:
    # The runtime calls these points (provider, sweeper, webhooks, dead letters); ops counts them.
    model, queue = f"m-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"
    before = {
        "admitted": _sample("chatq_provider_requests_total", model=model),
        "refused": _sample("chatq_provider_refusals_total", model=model, status="429"),
        "waits": _sample("chatq_provider_slot_waits_total", model=model, reason="tokens"),
        "wait_s": _sample("chatq_provider_slot_wait_seconds_total", model=model),
        "resent": _sample("chatq_sweeper_actions_total", action="resent"),
        "expired": _sample("chatq_sweeper_actions_total", action="expired_lease"),
        "repaired": _sample("chatq_sweeper_actions_total", action="repaired_event"),
        "refused_hook": _sample("chatq_webhook_attempts_total", outcome="refused"),
        "post_s": _sample("chatq_webhook_attempt_seconds_count"),
        "set_aside": _sample("chatq_messages_set_aside_total", queue=queue),
    }
    registry = hooks.HookRegistry([MetricsHooks()])
    registry.provider_admitted(hook_points.ProviderAdmitted(model=model))
    registry.provider_refused(hook_points.ProviderRefused(model=model, status="429"))
    registry.slot_wait(hook_points.SlotWait(model=model, reason="tokens", seconds=2.5))
    registry.sweep_resent(hook_points.SweepResent(resent=3, expired_leases=1))
    registry.sweep_repaired(hook_points.SweepRepaired(events=2))
    registry.webhook_attempt(hook_points.WebhookAttempt(outcome="refused", seconds=None))
    registry.webhook_attempt(hook_points.WebhookAttempt(outcome="delivered", seconds=0.1))
    registry.message_set_aside(hook_points.MessageSetAside(queue=queue, reason="not JSON"))
    after = {
        "admitted": _sample("chatq_provider_requests_total", model=model),
        "refused": _sample("chatq_provider_refusals_total", model=model, status="429"),
        "waits": _sample("chatq_provider_slot_waits_total", model=model, reason="tokens"),
        "wait_s": _sample("chatq_provider_slot_wait_seconds_total", model=model),
        "resent": _sample("chatq_sweeper_actions_total", action="resent"),
        "expired": _sample("chatq_sweeper_actions_total", action="expired_lease"),
        "repaired": _sample("chatq_sweeper_actions_total", action="repaired_event"),
        "refused_hook": _sample("chatq_webhook_attempts_total", outcome="refused"),
        "post_s": _sample("chatq_webhook_attempt_seconds_count"),
        "set_aside": _sample("chatq_messages_set_aside_total", queue=queue),
    }
    assert {key: after[key] - before[key] for key in before} == {
        "admitted": 1,
        "refused": 1,
        "waits": 1,
        "wait_s": 2.5,
        "resent": 3,
        "expired": 1,
        "repaired": 2,
        "refused_hook": 1,
        "post_s": 1,  # a refused attempt made no POST: only the delivered one is timed
        "set_aside": 1,
    }


def test_a_process_that_is_not_wired_refuses_to_run_hooks_and_the_app_wires_it() -> None:
    script = (
        "import sys\n"
        "from worker.errors import HooksNotWired\n"
        "from worker.runtime.observers.observers import get_hooks\n"
        "try:\n"
        "    get_hooks()\n"
        "except HooksNotWired:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('an unwired process ran hooks')\n"
        "assert not any(name.startswith('worker.ops') for name in sys.modules), 'the runtime loaded ops'\n"
        "from worker.app import app\n"
        "assert 'worker.wiring' in app.conf.include\n"
        "app.loader.import_default_modules()\n"
        "print([type(hook).__name__ for hook in get_hooks().hooks])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "['MetricsHooks',",
        "'LogHooks',",
        "'BudgetHooks',",
        "'WebhookHooks',",
        "'ForgetDeletedTurns']",
    ]

"""The retry policy: whether a delivery of a turn is tried again, and when, for every cause.

One frozen value built from `Settings` decides all three cases a turn is delivered again:

- the agent failed (`AgentInvocationError`): retried until `CHATQ_MAX_ATTEMPTS` invocations ran,
  `CHATQ_RETRY_DELAY` seconds apart, then the turn fails (the attempt count lives in Postgres);
- an outage (Postgres or Redis unreachable): retried without limit, backing off exponentially up
  to a cap, since the turn is not at fault and uses up no attempt;
- the session is busy with an earlier turn running elsewhere: checked again when that turn's
  lease would run out, plus a small margin;
- the model service refused for now (429, 503/529, unreachable, a timeout before the first
  token): tried again after the wait it asked for (else backing off), with jitter, using up no
  attempt, until `CHATQ_PROVIDER_PATIENCE` seconds of refusals have passed;
- the model's shared limits have no slot free (`worker.runtime.policy.limits`): tried again when the
  limiter says, never giving up (a long batch waits its turn; that is not a failure).

It also decides when a webhook delivery that did not get a 2xx is tried again: backing off
exponentially from `CHATQ_WEBHOOK_BACKOFF` up to 10 minutes, for `CHATQ_WEBHOOK_RETRY_FOR`
seconds after the delivery was due (about an hour).

Pure: no services, no Celery. `worker.runtime.delivery.runner` and `worker.runtime.intake.tasks` ask it;
nothing else decides.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chatq.settings import Settings


class RetryCause(enum.StrEnum):
    """Why a delivery is tried again."""

    AGENT_FAILURE = "agent_failure"
    OUTAGE = "outage"
    BUSY = "busy"
    PROVIDER = "provider"
    SLOT = "slot"
    BUDGET = "budget"
    WEBHOOK = "webhook"


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """What the policy decided for one delivery."""

    cause: RetryCause
    """Why the question came up."""
    retry: bool
    """True: deliver the turn again after `delay`; False: give up (the turn fails)."""
    delay: float
    """Seconds before the next delivery (0.0 when giving up)."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retry, back-off and give-up for every cause (docs/contract.md, "Retry policy")."""

    max_attempts: int = 2
    """Handler invocations per turn when the agent fails (`CHATQ_MAX_ATTEMPTS`)."""
    agent_delay: float = 1.0
    """Seconds between a failed invocation and the next (`CHATQ_RETRY_DELAY`)."""
    outage_base: float = 1.0
    """Seconds before the first re-delivery after an outage; doubled on each further one."""
    outage_cap: float = 30.0
    """Longest wait between re-deliveries during an outage."""
    outage_doublings: int = 5
    """Doublings after which the outage back-off stops growing (1, 2, 4, ... 32 s, capped)."""
    busy_margin: float = 0.5
    """Seconds added to a busy session's wait, so the next look comes after the lease ran out."""
    provider_patience: float = 900.0
    """Seconds of refusals by the model service after which a turn fails (`CHATQ_PROVIDER_PATIENCE`)."""
    provider_base: float = 1.0
    """Wait after a refusal that named none; doubled on each further refusal of the turn."""
    provider_cap: float = 60.0
    """Longest wait between tries when the service named none."""
    provider_jitter: float = 0.2
    """Up to this fraction is added to the wait, so refused turns do not come back together."""
    budget_wait: float = 0.5
    """Seconds a turn waits, near its tenant's budget, for the tenant's running turns to end (`worker.budgets`)."""
    webhook_base: float = 5.0
    """Seconds before a webhook delivery's first retry (`CHATQ_WEBHOOK_BACKOFF`); doubled on each further one."""
    webhook_cap: float = 600.0
    """Longest wait between two attempts of a webhook delivery."""
    webhook_window: float = 3_600.0
    """Seconds after a delivery was due during which it is retried (`CHATQ_WEBHOOK_RETRY_FOR`)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The policy the worker's configuration describes."""
        return cls(
            max_attempts=settings.max_attempts,
            agent_delay=settings.retry_delay,
            provider_patience=settings.provider_patience,
            webhook_base=settings.webhook_backoff,
            webhook_window=settings.webhook_retry_for,
        )

    def after_agent_failure(self, attempt: int) -> RetryDecision:
        """After invocation number `attempt` (1-based) raised `AgentInvocationError`."""
        if attempt < self.max_attempts:
            return RetryDecision(cause=RetryCause.AGENT_FAILURE, retry=True, delay=self.agent_delay)
        return RetryDecision(cause=RetryCause.AGENT_FAILURE, retry=False, delay=0.0)

    def after_outage(self, retries: int) -> RetryDecision:
        """After a delivery hit an outage, `retries` re-deliveries into it (Celery's counter); never gives up."""
        delay = min(self.outage_cap, self.outage_base * 2 ** min(max(retries, 0), self.outage_doublings))
        return RetryDecision(cause=RetryCause.OUTAGE, retry=True, delay=delay)

    def when_busy(self, seconds: float | None) -> RetryDecision:
        """The session's earlier turn runs elsewhere, its lease good for `seconds` more (None: unknown)."""
        return RetryDecision(cause=RetryCause.BUSY, retry=True, delay=max(seconds or 0.0, 0.0) + self.busy_margin)

    def when_provider_busy(
        self, retry_after: float | None, *, refusals: int, busy_for: float, jitter: float
    ) -> RetryDecision:
        """The service refused the turn's `refusals`-th try (1-based), asking for `retry_after` seconds
        (None: it did not say), `busy_for` seconds after its first refusal; `jitter` is in [0, 1)."""
        if retry_after is None:
            retry_after = min(self.provider_cap, self.provider_base * 2 ** min(max(refusals - 1, 0), 6))
        delay = max(retry_after, 0.05) * (1.0 + self.provider_jitter * min(max(jitter, 0.0), 1.0))
        if busy_for + delay > self.provider_patience:
            return RetryDecision(cause=RetryCause.PROVIDER, retry=False, delay=0.0)
        return RetryDecision(cause=RetryCause.PROVIDER, retry=True, delay=delay)

    def when_no_slot(self, wait: float) -> RetryDecision:
        """The model's shared limits have no slot for `wait` seconds (the limiter spaced the waiters)."""
        return RetryDecision(cause=RetryCause.SLOT, retry=True, delay=max(wait, 0.01))

    def when_budget_waits(self) -> RetryDecision:
        """Near its tenant's budget, other turns of the tenant run: look again after `budget_wait`."""
        return RetryDecision(cause=RetryCause.BUDGET, retry=True, delay=self.budget_wait)

    def after_webhook_attempt(self, attempts: int, elapsed: float) -> RetryDecision:
        """After `attempts` attempts of a webhook delivery failed, `elapsed` seconds after it was due."""
        delay = min(self.webhook_cap, self.webhook_base * 2 ** min(max(attempts - 1, 0), 30))
        if elapsed + delay > self.webhook_window:
            return RetryDecision(cause=RetryCause.WEBHOOK, retry=False, delay=0.0)
        return RetryDecision(cause=RetryCause.WEBHOOK, retry=True, delay=delay)

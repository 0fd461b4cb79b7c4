"""Hook points outside a turn's lifecycle: what the runtime counts for operators, as named events.

The provider's admission, the sweeper, webhook deliveries and the dead letters call these points
on the process's registry (`worker.runtime.observers.observers.get_hooks()`) instead of bumping counters
inline; `worker.ops.metrics.MetricsHooks` turns them into Prometheus counters. `TurnHooks`
(`worker.runtime.observers.hooks`) inherits them, so one observer class can watch both kinds of point.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MessageSetAside",
    "ProviderAdmitted",
    "ProviderRefused",
    "ScheduleFired",
    "ServiceEmitter",
    "ServiceHooks",
    "SlotWait",
    "SweepRepaired",
    "SweepResent",
    "WebhookAttempt",
]


@dataclass(frozen=True, kw_only=True)
class ProviderAdmitted:
    """A turn was given a slot under its model's shared limits."""

    model: str
    """The model the slot is for."""


@dataclass(frozen=True, kw_only=True)
class ProviderRefused:
    """The model service refused a turn before its first text (429, 503, ...)."""

    model: str
    """The model asked."""
    status: str
    """The HTTP status, or the refusal's reason when there was none."""


@dataclass(frozen=True, kw_only=True)
class SlotWait:
    """A turn without a free slot was put back to wait."""

    model: str
    """The model it waits for."""
    reason: str
    """The limiter's reason (requests, tokens, concurrency, ...)."""
    seconds: float
    """How long it was told to wait."""


@dataclass(frozen=True, kw_only=True)
class SweepResent:
    """A sweep re-sent turns that were lost in the queue or whose lease expired."""

    resent: int
    """Turns re-sent because no message of theirs was waiting (leases not counted)."""
    expired_leases: int
    """Turns re-sent because their worker's lease lapsed."""


@dataclass(frozen=True, kw_only=True)
class SweepRepaired:
    """A sweep published the terminal events of ended turns whose publisher died first."""

    events: int
    """Events published."""


@dataclass(frozen=True, kw_only=True)
class ScheduleFired:
    """A firing pass handled one due schedule (`worker.runtime.recovery.schedule_firing`)."""

    schedule_id: object
    """The schedule (a UUID)."""
    runs: int
    """Turns it created."""
    skipped: int
    """Due ticks that made no turn (overlap skip, misfire)."""


@dataclass(frozen=True, kw_only=True)
class WebhookAttempt:
    """A webhook delivery attempt ended."""

    outcome: str
    """delivered, retry, failed (a POST was made) or refused (no POST: the address rule)."""
    seconds: float | None
    """The POST, connect to answer; None when none was made."""


@dataclass(frozen=True, kw_only=True)
class MessageSetAside:
    """A malformed queue item was refused and moved to the dead letters (`chatq.dead`)."""

    queue: str
    """The queue it was taken from."""
    reason: str
    """Why it was refused."""


class ServiceHooks:
    """Observer of the points above: override the ones you need; each default does nothing."""

    def provider_admitted(self, event: ProviderAdmitted) -> None:
        """A turn got a slot."""

    def provider_refused(self, event: ProviderRefused) -> None:
        """The model service refused a turn."""

    def slot_wait(self, event: SlotWait) -> None:
        """A turn waits for a slot."""

    def sweep_resent(self, event: SweepResent) -> None:
        """A sweep re-sent turns."""

    def sweep_repaired(self, event: SweepRepaired) -> None:
        """A sweep published missing terminal events."""

    def schedule_fired(self, event: ScheduleFired) -> None:
        """A due schedule was fired."""

    def webhook_attempt(self, event: WebhookAttempt) -> None:
        """A webhook attempt ended."""

    def message_set_aside(self, event: MessageSetAside) -> None:
        """A queue item was set aside."""


class ServiceEmitter(ServiceHooks):
    """The registry's side of the points above: each calls `_emit` with its name."""

    def _emit(self, point: str, event: object) -> None:
        raise NotImplementedError

    def provider_admitted(self, event: ProviderAdmitted) -> None:
        self._emit("provider_admitted", event)

    def provider_refused(self, event: ProviderRefused) -> None:
        self._emit("provider_refused", event)

    def slot_wait(self, event: SlotWait) -> None:
        self._emit("slot_wait", event)

    def sweep_resent(self, event: SweepResent) -> None:
        self._emit("sweep_resent", event)

    def sweep_repaired(self, event: SweepRepaired) -> None:
        self._emit("sweep_repaired", event)

    def schedule_fired(self, event: ScheduleFired) -> None:
        self._emit("schedule_fired", event)

    def webhook_attempt(self, event: WebhookAttempt) -> None:
        self._emit("webhook_attempt", event)

    def message_set_aside(self, event: MessageSetAside) -> None:
        self._emit("message_set_aside", event)

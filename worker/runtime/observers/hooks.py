"""Lifecycle hooks of a turn: the runner runs a turn, hooks observe it (metrics, log lines, ...).

Modelled on dramatiq's middleware: `TurnHooks` has one no-op method per hook point, a hook
overrides the ones it cares about, and the process's `HookRegistry` (built once, by
`worker.runtime.observers.observers.get_hooks()`, from `worker.wiring.default_hooks()`) calls every hook in order.
A hook that raises is logged (masked) and skipped; the turn and the hooks after it go on. Hooks
run on the turn's thread, in the middle of its delivery: they must be quick and must not block
(hand slow work to a thread).

Adding an observer, such as a webhook sender, is one class: subclass `TurnHooks`, override the
points it needs, and append an instance in `worker.wiring.default_hooks()`. The runner
does not change.

The points of one delivery, in order (each payload is a frozen value; `Facts` names the turn):

    before_claim                      every delivery, before it claims the turn
    started                           an attempt begins (the claim succeeded)
      first_text                      the attempt streamed its first text
      tool                            the attempt streamed a tool call's progress (each time)
      approval_waited                 the attempt resumes a paused turn (once per decided call)
      succeeded | failed | retried | cancelled | handed_back | paused | lost
    ended                             the attempt is over (exactly once after every `started`)

A delivery that runs no attempt emits `before_claim` and then at most one of `rejected` (an
invalid message), `retried` (cause `busy`: an earlier turn of the session runs elsewhere; cause
`slot`: its model has no slot free under the shared limits),
`failed` / `cancelled` (`at_claim`: the turn had ended before it could run), `handed_back`
(`running` False: the worker was shutting down). An outage (Postgres or Redis unreachable) ends
the attempt with `ended` (outcome `raised`) and then `retried` (cause `outage`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatq.masking import mask_secrets
from chatq.settings import Settings
from worker.runtime.observers.hook_points import ServiceEmitter, ServiceHooks
from worker.runtime.policy.retry import RetryCause

if TYPE_CHECKING:
    from worker.payload import TurnRequest
    from worker.store.claims import Claim

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Facts:
    """Which turn and attempt a hook call is about."""

    turn_id: uuid.UUID
    """The turn (the task id)."""
    session_id: uuid.UUID
    """Its session."""
    attempt: int
    """The handler invocation (1-based); 0 when the delivery ran none."""
    framework: str | None = None
    """The session's agent framework; None when the delivery ran no attempt."""
    model: str | None = None
    """The model the attempt runs on (the session's, or this worker's default); None likewise."""
    has_webhook: bool | None = None
    """Whether the turn or its session has a webhook (known from the claim); None when the delivery ran no attempt."""
    tenant: str | None = None
    """The tenant that owns its session (from the claim); None for no tenant, or when the delivery ran no attempt."""

    @classmethod
    def of_claim(cls, claim: Claim, settings: Settings) -> Facts:
        """The facts of a claimed turn's attempt (`settings`, the runtime's, name the default model)."""
        return cls(
            turn_id=claim.turn_id,
            session_id=claim.session.id,
            attempt=claim.attempt,
            framework=claim.session.agent_framework,
            # A session without a model (NULL) runs on this worker's default.
            model=settings.session_model(claim.session.model),
            has_webhook=claim.has_webhook,
            tenant=claim.session.tenant,
        )

    @classmethod
    def of_request(cls, request: TurnRequest, *, attempt: int = 0) -> Facts:
        """The facts of a delivery that ran no attempt."""
        return cls(turn_id=request.turn_id, session_id=request.session_id, attempt=attempt)


@dataclass(frozen=True, kw_only=True)
class Claiming:
    """A delivery is about to claim its turn."""

    turn_id: uuid.UUID
    """The turn the message names."""
    session_id: uuid.UUID
    """Its session."""
    queue: str
    """The queue the message was taken from."""
    worker: str
    """This worker's node name."""


@dataclass(frozen=True, kw_only=True)
class Started:
    """An attempt begins: the turn is claimed and its `started` event published."""

    turn: Facts
    """The turn and attempt."""
    deliveries: int
    """Deliveries of the turn so far, this one included (above 1: a worker stopped mid-turn before)."""


@dataclass(frozen=True, kw_only=True)
class FirstText:
    """The attempt streamed its first text."""

    turn: Facts
    """The turn and attempt."""
    seconds: float
    """From the claim to the first text (time to first token)."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """The attempt streamed a tool call's progress (the `tool` event)."""

    turn: Facts
    """The turn and attempt."""
    name: str | None
    """The tool's name."""
    call_id: str | None
    """The model's id of the call."""
    status: str | None
    """The call's status as the handler reported it (started, finished, ...)."""


@dataclass(frozen=True, kw_only=True)
class Succeeded:
    """The reply and its usage are stored and the `final` event published."""

    turn: Facts
    """The turn and attempt."""
    seconds: float
    """From the claim to the stored reply."""
    messages: int
    """Messages stored (assistant and tool)."""
    prompt_tokens: int
    """Prompt tokens of the attempt."""
    completion_tokens: int
    """Completion tokens of the attempt."""
    total_tokens: int
    """Both."""


@dataclass(frozen=True, kw_only=True)
class Failed:
    """The turn ended `failed` (its `error` event is published)."""

    turn: Facts
    """The turn and the attempt it failed after."""
    error: str
    """The user-visible error, secrets masked."""
    at_claim: bool = False
    """True: the delivery found the turn already failed (poisoned) at its claim and ran nothing."""
    prompt_tokens: int = 0
    """Prompt tokens the failed turn stored: its finished steps' when its tenant's budget stopped it, else 0."""
    completion_tokens: int = 0
    """Completion tokens it stored, likewise."""


@dataclass(frozen=True, kw_only=True)
class Retried:
    """The delivery is given up for now; the policy (`worker.runtime.policy.retry`) sends it again after `delay`."""

    turn: Facts
    """The turn and the attempt that ended (0 when none ran)."""
    cause: RetryCause
    """Why: the agent failed, an outage, or a busy session."""
    delay: float
    """Seconds until the next delivery."""
    error: str | None = None
    """What went wrong (masked), for the agent failing and outages."""


@dataclass(frozen=True, kw_only=True)
class Cancelled:
    """The turn ended `cancelled` (its `cancelled` event is published)."""

    turn: Facts
    """The turn and attempt."""
    at_claim: bool = False
    """True: it was cancelled before it ran, and this delivery only announced it."""


@dataclass(frozen=True, kw_only=True)
class Paused:
    """The turn paused for a person's decision on tool calls (`awaiting_approval`; its event is published)."""

    turn: Facts
    """The turn and the attempt that paused."""
    calls: tuple[str, ...]
    """The tools whose calls wait, one entry per call."""
    seconds: float
    """How long it waits at most (its deadline, from now)."""


@dataclass(frozen=True, kw_only=True)
class ApprovalWaited:
    """An attempt resumes a paused turn: one call of its round was decided after waiting this long."""

    turn: Facts
    """The turn and the attempt that resumes it."""
    outcome: str
    """`approved`, `denied` or `timed_out` (the sweep's denial at the deadline)."""
    seconds: float
    """From the pause (the call recorded as waiting) to its decision."""


@dataclass(frozen=True, kw_only=True)
class HandedBack:
    """The worker is shutting down and passed the turn on to another worker."""

    turn: Facts
    """The turn and the attempt that was interrupted (0 when none ran)."""
    running: bool
    """True: an attempt was interrupted and requeued; False: the message was passed on before its claim."""


@dataclass(frozen=True, kw_only=True)
class Lost:
    """The attempt lost its lease to another worker and wrote nothing."""

    turn: Facts
    """The turn and attempt."""
    storing: bool
    """True: the lease was found lost only when storing the reply."""


@dataclass(frozen=True, kw_only=True)
class Rejected:
    """A message was refused before anything was stored (invalid, or its turn id names another session's turn)."""

    turn_id: uuid.UUID
    """The turn id, as far as it can be trusted (the nil UUID otherwise)."""
    session_id: uuid.UUID | None
    """The session id, when it can be trusted."""
    error: str
    """Why, naming the field."""


@dataclass(frozen=True, kw_only=True)
class Ended:
    """The attempt is over, whatever its outcome (it follows every `started` exactly once)."""

    turn: Facts
    """The turn and attempt."""
    outcome: str
    """`worker.runtime.delivery.runner.Outcome`'s value, or `raised` when the attempt raised (an outage:
    the task retries)."""
    seconds: float
    """From the claim to the end of the attempt."""
    error: str | None = None
    """The turn's error when it failed."""


class TurnHooks(ServiceHooks):
    """Observer of turn lifecycles (and of the points outside a turn, `worker.runtime.observers.hook_points`):
    override the points you need; each default does nothing."""

    def before_claim(self, event: Claiming) -> None:
        """A delivery is about to claim its turn."""

    def started(self, event: Started) -> None:
        """An attempt begins."""

    def first_text(self, event: FirstText) -> None:
        """The attempt streamed its first text."""

    def tool(self, event: ToolCall) -> None:
        """The attempt streamed a tool call's progress."""

    def succeeded(self, event: Succeeded) -> None:
        """The reply is stored."""

    def failed(self, event: Failed) -> None:
        """The turn failed."""

    def retried(self, event: Retried) -> None:
        """The delivery will be tried again."""

    def cancelled(self, event: Cancelled) -> None:
        """The turn was cancelled."""

    def handed_back(self, event: HandedBack) -> None:
        """The turn was passed to another worker at shutdown."""

    def paused(self, event: Paused) -> None:
        """The turn paused for a person's decision on tool calls (metrics, notifications hang here)."""

    def approval_waited(self, event: ApprovalWaited) -> None:
        """An attempt resumes a paused turn: one per call its round decided (once, by the attempt that resumes)."""

    def lost(self, event: Lost) -> None:
        """The attempt lost its lease."""

    def rejected(self, event: Rejected) -> None:
        """A message was refused."""

    def ended(self, event: Ended) -> None:
        """The attempt is over."""


POINTS = tuple(name for cls in (TurnHooks, ServiceHooks) for name in vars(cls) if not name.startswith("_"))
"""Every hook point, in declaration order (a turn's, then those outside a turn)."""


class HookRegistry(ServiceEmitter, TurnHooks):
    """An ordered list of hooks, called in order at each point; one hook raising never stops a turn."""

    def __init__(self, hooks: Sequence[TurnHooks] = ()) -> None:
        self._lock = threading.Lock()
        self._hooks: tuple[TurnHooks, ...] = ()
        self._points: dict[str, tuple[TurnHooks, ...]] = {}
        self._install(tuple(hooks))

    @property
    def hooks(self) -> tuple[TurnHooks, ...]:
        """The registered hooks, in calling order."""
        return self._hooks

    def add(self, hook: TurnHooks) -> None:
        """Append a hook: it is called after those already registered."""
        with self._lock:
            self._install((*self._hooks, hook))

    def remove(self, hook: TurnHooks) -> None:
        """Remove a hook (no error when it is not registered)."""
        with self._lock:
            self._install(tuple(h for h in self._hooks if h is not hook))

    @contextlib.contextmanager
    def added(self, hook: TurnHooks) -> Iterator[TurnHooks]:
        """`hook` registered for the duration of the block (tests, temporary observers)."""
        self.add(hook)
        try:
            yield hook
        finally:
            self.remove(hook)

    def _install(self, hooks: tuple[TurnHooks, ...]) -> None:
        # Per point, only the hooks that override it: a point nobody watches costs one dict lookup.
        points = {
            point: tuple(h for h in hooks if getattr(type(h), point) is not getattr(TurnHooks, point))
            for point in POINTS
        }
        self._hooks, self._points = hooks, points

    def _emit(self, point: str, event: object) -> None:
        for hook in self._points.get(point, ()):
            try:
                getattr(hook, point)(event)
            except Exception as exc:
                # Observers must not change what a turn does: log (masked, with the traceback the
                # worker's log filter masks too) and go on with the next hook.
                log.warning(
                    "hook %s.%s raised, ignored: %s",
                    type(hook).__name__,
                    point,
                    mask_secrets(f"{type(exc).__name__}: {exc}"),
                    exc_info=True,
                )

    def before_claim(self, event: Claiming) -> None:
        self._emit("before_claim", event)

    def started(self, event: Started) -> None:
        self._emit("started", event)

    def first_text(self, event: FirstText) -> None:
        self._emit("first_text", event)

    def tool(self, event: ToolCall) -> None:
        self._emit("tool", event)

    def succeeded(self, event: Succeeded) -> None:
        self._emit("succeeded", event)

    def failed(self, event: Failed) -> None:
        self._emit("failed", event)

    def retried(self, event: Retried) -> None:
        self._emit("retried", event)

    def cancelled(self, event: Cancelled) -> None:
        self._emit("cancelled", event)

    def handed_back(self, event: HandedBack) -> None:
        self._emit("handed_back", event)

    def paused(self, event: Paused) -> None:
        self._emit("paused", event)

    def approval_waited(self, event: ApprovalWaited) -> None:
        self._emit("approval_waited", event)

    def lost(self, event: Lost) -> None:
        self._emit("lost", event)

    def rejected(self, event: Rejected) -> None:
        self._emit("rejected", event)

    def ended(self, event: Ended) -> None:
        self._emit("ended", event)

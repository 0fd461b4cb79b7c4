"""Errors of the handlers package. Each docstring is the error's default, user-visible message."""

from __future__ import annotations

from typing import Any

from chatq.errors import ChatqError


class HandlerError(ChatqError):
    """The agent handler failed."""


class AgentInvocationError(HandlerError):
    """The agent failed to produce a reply."""


class ProviderBusy(AgentInvocationError):
    """The model service is busy (rate limited, overloaded or unreachable); the turn waits and runs again."""

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str = "rate_limited",
        status: int | None = None,
        retry_after: float | None = None,
        limit_requests: float | None = None,
        limit_tokens: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        """Why: `rate_limited` (429), `overloaded` (502/503/504/529), `unreachable` or `timeout`."""
        self.status = status
        """The HTTP status, when the service answered."""
        self.retry_after = retry_after
        """Seconds the service asked to wait (`Retry-After`, `x-ratelimit-reset-*`), when it said."""
        self.limit_requests = limit_requests
        """The requests-per-minute limit the service reported (`x-ratelimit-limit-requests`)."""
        self.limit_tokens = limit_tokens
        """The tokens-per-minute limit the service reported (`x-ratelimit-limit-tokens`)."""


class TurnTimeout(AgentInvocationError):
    """The agent did not finish within the turn timeout."""


EMPTY_REPLY = "The model returned an empty reply."
"""The error of a turn that ends without an answer (`handlers.prepared.is_answer`), which chatq treats as a failure."""

TOO_MANY_STEPS = "The agent stopped: too many tool steps without a final answer."
"""The error of an agent loop that reached its step limit while the model still called tools."""


class OutcomeUnknown(HandlerError):
    """A tool call's outcome is unknown (it started, its result was never recorded, and it is not safe to repeat)."""

    def __init__(self, message: str | None = None, *, call_id: str | None = None, tool: str | None = None) -> None:
        if message is None and call_id is not None:
            message = (
                f"The outcome of tool call {call_id} ({tool or 'unknown tool'}) is unknown: it started in an earlier "
                "attempt that ended before its result was recorded, and the tool is not safe to repeat."
            )
        super().__init__(message)
        self.call_id = call_id
        """The call whose outcome is unknown."""
        self.tool = tool
        """Its tool's name."""


class AwaitingApproval(HandlerError):
    """The turn waits for a person to approve or deny tool calls."""

    def __init__(self, message: str | None = None, *, calls: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.calls = calls
        """The round's calls that wait (`handlers.approvals.PendingCall`), recorded in the journal."""


class StepNotRecorded(HandlerError):
    """A finished step of the turn could not be recorded in its journal; the attempt stops."""

    def __init__(self, message: str | None = None, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale
        """True: this attempt no longer holds its turn (another attempt took it over, or it ended).
        False: the store failed (the cause is chained), and the delivery is tried again."""


class BudgetSpent(HandlerError):
    """The tenant's budget is spent: the turn stops at this step, its finished steps kept."""


class UnknownFramework(HandlerError):
    """The session's agent framework is not one chatq knows."""


class InvalidHandler(HandlerError, TypeError):
    """The framework's registered class is not a complete agent handler."""


class UnknownTool(HandlerError):
    """No tool of that name is registered."""


class ThreadHopError(HandlerError):
    """A handler's stream must be advanced on one thread; iterate it on one thread or use astream()."""

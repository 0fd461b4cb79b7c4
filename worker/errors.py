"""Errors of the worker package. Each docstring is the error's default, user-visible message.

The root and the errors every layer shares live in `chatq.errors`; they are re-exported here.
"""

from __future__ import annotations

from chatq.errors import ChatqError, ConfigError, SessionNotFound, TurnNotFound

__all__ = [
    "BatchNotFound",
    "ChatqError",
    "CliError",
    "ConfigError",
    "HandBack",
    "HooksNotWired",
    "InvalidCursor",
    "InvalidTurn",
    "LeaseLost",
    "MessageRefused",
    "NotCancellable",
    "SchemaMissing",
    "ServiceUnavailable",
    "SessionBusy",
    "SessionDeleted",
    "SessionNotFound",
    "TenantMismatch",
    "TurnCancelled",
    "TurnConflict",
    "TurnExists",
    "TurnFailed",
    "TurnNotFound",
    "WaitTimeout",
    "WebhookRefused",
]


class InvalidTurn(ChatqError):
    """The turn is invalid and was not run."""


class TenantMismatch(InvalidTurn):
    """The session belongs to another tenant (or to none); nothing was stored."""


class InvalidSchedule(InvalidTurn):
    """The schedule is invalid (cron, zone, period, session template); nothing was stored."""


class ScheduleNotFound(ChatqError):
    """No schedule has this id (for this tenant)."""


class InvalidCursor(InvalidTurn):
    """The page cursor is not one this list handed out."""


class SessionDeleted(SessionNotFound):
    """The session was deleted."""


class BatchNotFound(ChatqError):
    """No session belongs to this batch."""


class WaitTimeout(ChatqError):
    """The turn did not end in time."""


class TurnFailed(ChatqError):
    """The turn failed."""


class WebhookRefused(InvalidTurn):
    """The webhook URL is refused: chatq does not send to it."""


class MessageRefused(ChatqError):
    """A queue item is not a valid chatq task message."""


class SessionBusy(ChatqError):
    """The session is busy with another turn."""


class TurnExists(ChatqError):
    """A turn with this id already exists (a resubmission, or a duplicate message racing this one)."""


class TurnConflict(ChatqError):
    """A turn with this id already exists with different content."""


class ApprovalConflict(ChatqError):
    """The turn has no tool call awaiting that decision (not paused, no such call, or decided already)."""


class ApprovalExpired(ChatqError):
    """The approval deadline passed; the call was denied as timed out."""


class NotCancellable(ChatqError):
    """The turn has already finished and cannot be cancelled."""


class ServiceUnavailable(ChatqError):
    """A service chatq needs (Postgres or Redis) is not reachable."""


class SchemaMissing(ServiceUnavailable):
    """The database has no chatq tables yet: run `chatq db upgrade`."""


class CliError(ChatqError):
    """The command could not be carried out."""


# Raised between a handler's chunks and caught by the runner, never shown to users: they end one
# delivery early, each in its own way.


class TurnCancelled(ChatqError):
    """The turn was cancelled while it ran."""


class LeaseLost(ChatqError):
    """Another worker took the turn over: this attempt must not write."""


class HandBack(ChatqError):
    """The worker is shutting down: give the turn to another worker."""


class HooksNotWired(ChatqError):
    """The process's hooks are not wired: import worker.wiring (the Celery app loads it) before running turns."""

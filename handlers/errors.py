"""Errors of the handlers package. Each docstring is the error's default, user-visible message."""

from __future__ import annotations

from chatq.errors import ChatqError


class HandlerError(ChatqError):
    """The agent handler failed."""


class AgentInvocationError(HandlerError):
    """The agent failed to produce a reply."""


class TurnTimeout(AgentInvocationError):
    """The agent did not finish within the turn timeout."""


EMPTY_REPLY = "The model returned an empty reply."
"""The error of a completion with neither text nor tool calls, which chatq treats as a failure."""


class UnknownFramework(HandlerError):
    """The session's agent framework is not one chatq knows."""


class UnknownTool(HandlerError):
    """No tool of that name is registered."""


class ThreadHopError(HandlerError):
    """A handler's stream must be advanced on one thread; iterate it on one thread or use astream()."""

"""Map whatever a LangChain/OpenAI call raised to a short, user-visible AgentInvocationError.

The user sees the message (turn `error`, `error` events), so it names the kind of failure and
never carries the provider's raw text, which may echo request details. It needs only the `openai`
SDK's exception types, so any adapter that talks to an OpenAI-compatible API can use it.
"""

from __future__ import annotations

import logging

import openai
from sqlalchemy.exc import DBAPIError

from chatq.errors import ConfigError
from chatq.settings import mask_secrets
from handlers.abort import current_abort
from handlers.errors import AgentInvocationError, TurnTimeout

__all__ = ["TurnTimeout", "invocation_error"]

logger = logging.getLogger(__name__)


def invocation_error(exc: BaseException, *, timeout: float) -> AgentInvocationError:
    """The AgentInvocationError to raise for `exc` (returned as is when it already is one).

    Database errors (reading history while Postgres restarts) are not the agent's failure and must
    not use up an attempt: they are re-raised unchanged, for the worker to retry the delivery. A
    ConfigError (a model without the key it needs) is re-raised too: a retry would fail the same way.
    """
    if isinstance(exc, AgentInvocationError):
        return exc
    if isinstance(exc, DBAPIError | ConfigError):
        raise exc
    signal = current_abort()
    if signal is not None and signal.aborted:
        # The worker closed the request on purpose (a cancel, shutdown): it says why, not this.
        return AgentInvocationError(f"The model request was stopped ({signal.reason}).")
    message = _message(exc, timeout)
    # The detail goes to the log only (masked); a traceback only for failures that are not the
    # model service's, since those point at a bug rather than at the network or the provider.
    logger.warning(
        "agent invocation failed: %s: %s",
        type(exc).__name__,
        mask_secrets(str(exc))[:500],
        exc_info=not isinstance(exc, openai.APIError | TimeoutError),
    )
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return TurnTimeout(message)
    return AgentInvocationError(message)


def _message(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return f"The model did not answer within the turn timeout ({timeout:g} s)."
    if isinstance(exc, openai.AuthenticationError):
        return "The model service rejected the API key (HTTP 401)."
    if isinstance(exc, openai.RateLimitError):
        return "The model service is rate limiting requests (HTTP 429)."
    if isinstance(exc, openai.APIStatusError):
        return f"The model service returned an error (HTTP {exc.status_code})."
    if isinstance(exc, openai.APIConnectionError):
        return "Could not reach the model service."
    if isinstance(exc, openai.APIError):
        return "The model service returned an invalid response."
    return f"The agent failed ({type(exc).__name__})."

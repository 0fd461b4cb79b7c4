"""Map whatever a LangChain/OpenAI call raised to a short, user-visible AgentInvocationError.

The user sees the message (turn `error`, `error` events), so it names the kind of failure and
never carries the provider's raw text, which may echo request details. It needs only the `openai`
SDK's exception types, so any adapter that talks to an OpenAI-compatible API can use it.
"""

from __future__ import annotations

import logging

import openai

from chatq.errors import ConfigError
from chatq.masking import mask_secrets
from handlers.abort import current_abort
from handlers.errors import AgentInvocationError, ProviderBusy, TurnTimeout
from handlers.provider_headers import read_rate_limit_headers

__all__ = ["BUSY_STATUSES", "TurnTimeout", "invocation_error", "provider_busy"]

BUSY_STATUSES = frozenset({429, 502, 503, 504, 529})
"""HTTP statuses that mean "not now" (rate limited, overloaded, a gateway without an upstream),
not "this request is wrong": the turn waits and runs again (`handlers.errors.ProviderBusy`). A
400/401/403/404 is never among them, and a 500 keeps the ordinary retry-once rule."""

logger = logging.getLogger(__name__)


def invocation_error(exc: BaseException, *, timeout: float) -> AgentInvocationError:
    """The AgentInvocationError to raise for `exc` (returned as is when it already is one).

    A ConfigError (a model without the key it needs) is re-raised unchanged: a retry would fail the
    same way. No database error reaches an adapter: the store's reads happen before it runs
    (`build_turn_input`), and its search and recorder run inside `run_tool`, which turns a failure
    into the tool's "Error: ..." output.
    """
    if isinstance(exc, AgentInvocationError):
        return exc
    if isinstance(exc, ConfigError):
        raise exc
    signal = current_abort()
    if signal is not None and signal.aborted:
        # The worker closed the request on purpose (a cancel, shutdown): it says why, not this.
        return AgentInvocationError(f"The model request was stopped ({signal.reason}).")
    message = _message(exc, timeout)
    busy = provider_busy(exc, message)
    if busy is not None:
        # Back-pressure, not a failure: logged without a traceback, the worker decides when to retry.
        logger.info("model service busy (%s): %s", busy.reason, message)
        return busy
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


def provider_busy(exc: BaseException, message: str) -> ProviderBusy | None:
    """`exc` as ProviderBusy when it is the service's back-pressure (see BUSY_STATUSES), else None.

    The worker owns the back-off (the SDK's own retries are off, `max_retries=0`), so the wait the
    service asked for is read from the response's headers here and travels with the error.
    """
    if isinstance(exc, openai.APITimeoutError):
        return ProviderBusy(message, reason="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ProviderBusy(message, reason="unreachable")
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in BUSY_STATUSES:
        return None
    headers = read_rate_limit_headers(exc.response.headers)
    return ProviderBusy(
        message,
        reason="rate_limited" if exc.status_code == 429 else "overloaded",
        status=exc.status_code,
        retry_after=headers.retry_after,
        limit_requests=headers.limit_requests,
        limit_tokens=headers.limit_tokens,
    )


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

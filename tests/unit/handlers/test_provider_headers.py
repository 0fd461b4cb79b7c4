"""Reading a provider's rate-limit headers, and which SDK errors are back-pressure."""

from __future__ import annotations

import email.utils

import httpx
import openai
import pytest

from handlers.chat_models.errors import invocation_error
from handlers.errors import AgentInvocationError, ProviderBusy
from handlers.provider_headers import parse_duration, read_rate_limit_headers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1.0), ("1.5", 1.5), ("1s", 1.0), ("20ms", 0.02), ("6m0s", 360.0), ("1m30.5s", 90.5), ("1h", 3600.0)],
)
def test_durations_in_openai_and_plain_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-1", "5x", "nan"])
def test_unreadable_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


def test_retry_after_ms_wins_then_retry_after_then_the_spent_limits_reset() -> None:
    assert read_rate_limit_headers({"retry-after-ms": "250", "retry-after": "3"}).retry_after == 0.25
    assert read_rate_limit_headers({"Retry-After": "3"}).retry_after == 3.0
    spent_tokens = {
        "x-ratelimit-remaining-requests": "10",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
        "x-ratelimit-limit-requests": "300",
        "x-ratelimit-limit-tokens": "40000",
    }
    read = read_rate_limit_headers(spent_tokens)
    assert read.retry_after == 360.0
    assert (read.limit_requests, read.limit_tokens) == (300.0, 40000.0)
    assert read_rate_limit_headers({}).retry_after is None


@pytest.mark.parametrize(
    ("retry_after", "reset", "wait"),
    [("60", "59.5s", 59.5), ("1", "20ms", 0.02), ("1", "1s", 1.0), ("360", "6m0s", 360.0), ("2", "59.5s", 2.0)],
)
def test_a_whole_second_retry_after_gives_way_to_the_spent_windows_finer_reset(
    retry_after: str, reset: str, wait: float
) -> None:
    # A windowed provider: `Retry-After` rounds the window's end up to a second; the spent limit's
    # reset (OpenAI's formats) says it to the millisecond, and is taken only within that second.
    headers = {
        "retry-after": retry_after,
        "x-ratelimit-limit-requests": "120",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": reset,
    }
    read = read_rate_limit_headers(headers)
    assert read.retry_after == pytest.approx(wait)
    assert read.limit_requests == 120.0
    # A reset of a limit that is not spent never shortens the wait.
    assert read_rate_limit_headers({**headers, "x-ratelimit-remaining-requests": "3"}).retry_after == float(retry_after)


def test_retry_after_as_an_http_date() -> None:
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert read_rate_limit_headers({"retry-after": date}, now=now).retry_after == pytest.approx(30.0)


def _status_error(status: int, headers: dict[str, str]) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://stub/v1/chat/completions")
    response = httpx.Response(status, headers=headers, request=request, json={"error": {"message": "x"}})
    cls = openai.RateLimitError if status == 429 else openai.APIStatusError
    return cls("x", response=response, body=None)


@pytest.mark.parametrize(("status", "reason"), [(429, "rate_limited"), (503, "overloaded"), (529, "overloaded")])
def test_busy_statuses_become_provider_busy_with_the_wait(status: int, reason: str) -> None:
    error = invocation_error(_status_error(status, {"retry-after": "7"}), timeout=5)
    assert isinstance(error, ProviderBusy)
    assert (error.reason, error.status, error.retry_after) == (reason, status, 7.0)
    assert f"HTTP {status}" in error.message


@pytest.mark.parametrize("status", [400, 401, 403, 404, 500])
def test_other_statuses_stay_ordinary_failures(status: int) -> None:
    error = invocation_error(_status_error(status, {"retry-after": "7"}), timeout=5)
    assert isinstance(error, AgentInvocationError) and not isinstance(error, ProviderBusy)


def test_connection_errors_and_timeouts_are_back_pressure() -> None:
    request = httpx.Request("POST", "http://stub/v1/chat/completions")
    unreachable = invocation_error(openai.APIConnectionError(request=request), timeout=5)
    timed_out = invocation_error(openai.APITimeoutError(request=request), timeout=5)
    assert isinstance(unreachable, ProviderBusy) and unreachable.reason == "unreachable"
    assert isinstance(timed_out, ProviderBusy) and timed_out.reason == "timeout"
    assert "turn timeout" in timed_out.message

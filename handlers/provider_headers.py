"""What a model service's rate-limit headers say: how long to wait, and what its limits are.

OpenAI, Azure and most OpenAI-compatible gateways answer a 429 or 503 with some of

    retry-after: 2                    (seconds, or an HTTP date)
    retry-after-ms: 1500
    x-ratelimit-limit-requests: 300   x-ratelimit-remaining-requests: 0   x-ratelimit-reset-requests: 1s
    x-ratelimit-limit-tokens: 40000   x-ratelimit-remaining-tokens: 0     x-ratelimit-reset-tokens: 6m0s

(resets as Go-style durations such as `1s`, `6m0s`, `20ms`, or plain seconds). Framework-free:
adapters pass the response headers in, as a mapping with case-insensitive or lower-case keys.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RateLimitHeaders", "parse_duration", "read_rate_limit_headers"]

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
MAX_WAIT = 3600.0
"""Longest wait taken from a header: anything beyond is read as a misconfigured server."""


@dataclass(frozen=True, kw_only=True)
class RateLimitHeaders:
    """The parts of a response's headers that matter for back-pressure."""

    retry_after: float | None = None
    """Seconds to wait before the next request, when the service said."""
    limit_requests: float | None = None
    """Its requests-per-minute limit (`x-ratelimit-limit-requests`)."""
    limit_tokens: float | None = None
    """Its tokens-per-minute limit (`x-ratelimit-limit-tokens`)."""


def parse_duration(value: str | None) -> float | None:
    """Seconds in `value`: plain seconds (`"1.5"`) or a Go-style duration (`"6m0s"`, `"20ms"`)."""
    text = (value or "").strip().lower()
    if not text:
        return None
    try:
        return _bounded(float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return _bounded(sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts))


def _retry_after(value: str | None, now: float) -> float | None:
    """`Retry-After`: delta seconds or an HTTP date."""
    seconds = parse_duration(value)
    if seconds is not None or not value:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return _bounded(when.timestamp() - now)


def _bounded(seconds: float) -> float | None:
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_WAIT)


def _number(value: str | None) -> float | None:
    try:
        number = float((value or "").strip())
    except ValueError:
        return None
    return number if number > 0 else None


def read_rate_limit_headers(headers: Mapping[str, str], *, now: float | None = None) -> RateLimitHeaders:
    """Read the wait and the limits from `headers` (missing or unreadable ones are None).

    The wait is `retry-after-ms`, else `retry-after`, else the reset of whichever limit is used up
    (`x-ratelimit-remaining-* = 0`), else the longer of the two resets. A `retry-after` in whole
    seconds is rounded up: when the spent limit's reset lies in the second before it (`59.5s`
    against `60`), the reset is the finer answer.
    """
    get = {str(key).lower(): str(value) for key, value in headers.items()}.get
    clock = time.time() if now is None else now
    resets = {kind: parse_duration(get(f"x-ratelimit-reset-{kind}")) for kind in ("requests", "tokens")}
    spent = [
        seconds
        for kind, seconds in resets.items()
        if (get(f"x-ratelimit-remaining-{kind}") or "").strip() == "0" and seconds is not None
    ]
    wait: float | None = None
    if (ms := parse_duration(get("retry-after-ms"))) is not None:
        wait = ms / 1000.0
    if wait is None:
        wait = _retry_after(get("retry-after"), clock)
        if wait is not None and wait == int(wait) and spent and wait - 1 < max(spent) <= wait:
            wait = max(spent)
    if wait is None:
        known = [seconds for seconds in (spent or resets.values()) if seconds is not None]
        wait = max(known) if known else None
    return RateLimitHeaders(
        retry_after=wait,
        limit_requests=_number(get("x-ratelimit-limit-requests")),
        limit_tokens=_number(get("x-ratelimit-limit-tokens")),
    )

"""Server-wide limits that make the OpenAI stub behave like a real model provider.

`ProviderLimits(rpm=300, tpm=..., max_concurrent=...)` on an `OpenAIStub` (its `limits`) answers a
request over a limit the way OpenAI does: HTTP 429 with `retry-after`, `retry-after-ms` and the
`x-ratelimit-limit|remaining|reset-requests|tokens` headers, or, past the concurrency cap, 429 with
only `retry-after`. Rates are token buckets holding `burst_seconds` worth (a provider's per-minute
limit is enforced over short windows). Tokens are charged as the prompt's word count + 4 per
message, as the stub reports usage.

With `window=S` the request rate is a fixed window instead: `rpm * S / 60` requests from the first
request of a window until S seconds later, 429 beyond with `retry-after` (whole seconds) and
`x-ratelimit-reset-requests` (OpenAI's format, e.g. `59.5s`) saying when the window frees, and
`x-ratelimit-limit-requests: rpm` (per minute, as OpenAI's header means). A fleet that waits out
a refusal alone and then trickles, or lowers its rate from what it sent while it waited, shows
here; the token bucket refills smoothly and never shows it.

It counts what it answered (`stats()`), so tests and benchmarks read the 429 share from the
server's side. Scripted refusals (`[ratelimit-times: KEY N]`, `[overloaded-times: KEY N]`) live in
the stub itself.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

__all__ = ["ProviderLimits", "Refusal"]


@dataclass(frozen=True)
class Refusal:
    """What the stub answers instead of a completion."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "Rate limit reached"


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `250ms`, `59.5s`, `6m0s` (rounded up to the millisecond, never early)."""
    millis = max(math.ceil(seconds * 1000), 1)
    if millis < 1000:
        return f"{millis}ms"
    minutes, rest = divmod(millis, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{text}s" if minutes else f"{text}s"


class ProviderLimits:
    """Requests and tokens per minute and a concurrency cap, enforced across every request of the server."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        max_concurrent: int | None = None,
        burst_seconds: float = 1.0,
        window: float | None = None,
    ) -> None:
        self.rpm, self.tpm, self.max_concurrent = rpm, tpm, max_concurrent
        self.burst_seconds = burst_seconds
        self.window = window
        """Seconds of the fixed request window (None: the request rate is a token bucket)."""
        self._window_start = -math.inf
        self._window_count = 0
        self._lock = threading.Lock()
        self._requests = self._capacity(rpm)
        self._tokens = self._capacity(tpm)
        self._at = time.monotonic()
        self.in_flight = 0
        self.peak = 0
        self.answers: list[tuple[float, int]] = []
        """(time.time(), status) of every request: 200 or the refusal's status."""

    def _capacity(self, per_minute: float | None) -> float:
        return max(1.0, per_minute * self.burst_seconds / 60.0) if per_minute else 0.0

    def _refill(self, now: float) -> None:
        elapsed, self._at = now - self._at, now
        if self.window and now >= self._window_start + self.window:
            self._window_start, self._window_count = now, 0
        if self.rpm and not self.window:
            self._requests = min(self._capacity(self.rpm), self._requests + elapsed * self.rpm / 60.0)
        if self.tpm:
            self._tokens = min(self._capacity(self.tpm), self._tokens + elapsed * self.tpm / 60.0)

    def enter(self, tokens: int) -> Refusal | None:
        """Admit one request costing `tokens`, or say why not. An admitted request must `leave()`."""
        with self._lock:
            now = time.monotonic()
            self._refill(now)
            refusal = self._check(tokens)
            self.answers.append((time.time(), refusal.status if refusal else 200))
            if refusal is not None:
                return refusal
            if self.rpm:
                self._requests -= 1
                self._window_count += 1
            if self.tpm:
                self._tokens -= min(tokens, self._capacity(self.tpm))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            return None

    def _check(self, tokens: int) -> Refusal | None:
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            return Refusal(429, {"retry-after": "1"}, "Too many concurrent requests")
        if self.window and self.rpm:
            return self._check_window()
        short_requests = self.rpm and self._requests < 1
        cost = min(tokens, self._capacity(self.tpm)) if self.tpm else 0
        short_tokens = self.tpm and self._tokens < cost
        if not short_requests and not short_tokens:
            return None
        waits = []
        headers: dict[str, str] = {}
        if self.rpm:
            wait = max(0.0, (1 - self._requests) * 60.0 / self.rpm)
            waits.append(wait if short_requests else 0.0)
            headers.update(
                {
                    "x-ratelimit-limit-requests": str(int(self.rpm)),
                    "x-ratelimit-remaining-requests": str(max(int(self._requests), 0)),
                    "x-ratelimit-reset-requests": _duration(wait),
                }
            )
        if self.tpm:
            wait = max(0.0, (cost - self._tokens) * 60.0 / self.tpm)
            waits.append(wait if short_tokens else 0.0)
            headers.update(
                {
                    "x-ratelimit-limit-tokens": str(int(self.tpm)),
                    "x-ratelimit-remaining-tokens": str(max(int(self._tokens), 0)),
                    "x-ratelimit-reset-tokens": _duration(wait),
                }
            )
        wait = max(waits)
        headers["retry-after"] = str(max(1, math.ceil(wait)))
        headers["retry-after-ms"] = str(max(1, int(wait * 1000)))
        return Refusal(
            429, headers, "Rate limit reached for requests" if short_requests else "Rate limit reached for tokens"
        )

    def _check_window(self) -> Refusal | None:
        assert self.window and self.rpm
        allowed = max(1, int(self.rpm * self.window / 60.0))
        if self._window_count < allowed:
            return None
        wait = max(self._window_start + self.window - time.monotonic(), 0.001)
        headers = {
            "retry-after": str(max(1, math.ceil(wait))),
            "x-ratelimit-limit-requests": str(int(self.rpm)),
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": _duration(wait),
        }
        return Refusal(429, headers, "Rate limit reached for requests")

    def reset(self) -> None:
        """Full buckets and a new window, as if the provider had been idle (the counts stay)."""
        with self._lock:
            self._requests = self._capacity(self.rpm)
            self._tokens = self._capacity(self.tpm)
            self._window_start, self._window_count = -math.inf, 0

    def leave(self) -> None:
        """An admitted request ended."""
        with self._lock:
            self.in_flight = max(self.in_flight - 1, 0)

    def stats(self, since: float | None = None) -> dict[str, int]:
        """Answers counted since Unix time `since` (all when None): `requests`, `ok`, `refused`, `peak`."""
        with self._lock:
            answers = [status for at, status in self.answers if since is None or at >= since]
            peak = self.peak
        refused = sum(1 for status in answers if status != 200)
        return {"requests": len(answers), "ok": len(answers) - refused, "refused": refused, "peak": peak}

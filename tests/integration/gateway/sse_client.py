"""A small, strict Server-Sent Events reader over httpx streaming responses (for the tests)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Frame:
    """One dispatched SSE message, or a comment line (`comment` set, nothing else)."""

    id: str | None = None
    data: str | None = None
    retry: int | None = None
    comment: str | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def event(self) -> dict[str, Any]:
        assert self.data is not None, f"frame without data: {self.lines}"
        value = json.loads(self.data)
        assert isinstance(value, dict)
        return value


def iter_frames(response: httpx.Response, *, timeout: float = 60.0) -> Iterator[Frame]:
    """Frames as they arrive: messages (at their blank line) and comments (at once).

    Heartbeats keep a stream from ever going quiet, so a read timeout never fires: `timeout`
    bounds the whole stream instead, and a stuck test fails with what it had seen.
    """
    deadline = time.monotonic() + timeout
    frame = Frame()
    data: list[str] = []
    seen = 0
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise AssertionError(f"the event stream {response.url} did not end within {timeout}s ({seen} lines)")
        seen += 1
        if line == "":
            if data or frame.id is not None or frame.retry is not None:
                frame.data = "\n".join(data) if data else None
                yield frame
            frame, data = Frame(), []
            continue
        frame.lines.append(line)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "":
            yield Frame(comment=value, lines=[line])
        elif name == "id":
            frame.id = value
        elif name == "data":
            data.append(value)
        elif name == "retry":
            frame.retry = int(value)
        else:
            raise AssertionError(f"unexpected SSE field: {line!r}")


def messages(frames: Iterator[Frame]) -> Iterator[Frame]:
    """Only the frames that carry data."""
    return (frame for frame in frames if frame.data is not None)

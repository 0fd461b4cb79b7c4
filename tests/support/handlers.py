"""Driving a handler the way the worker does: prepare the turn's input, then stream the adapter on it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from handlers.base import BaseAgentHandler, StreamEvent


def stream_turn(
    handler: BaseAgentHandler, text: str, images: Sequence[str] | None = None, reply_to: int | None = None
) -> Iterator[StreamEvent]:
    """`handler.stream(turn)` on the input the worker would build for `text`."""
    return handler.stream(handler.prepare(text, images, reply_to))

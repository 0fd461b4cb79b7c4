"""Driving a handler the way the worker does, and plugging a framework in the way CHATQ_PLUGINS does."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from handlers import unregister_framework
from handlers.base import BaseAgentHandler, StreamEvent
from handlers.prepared import PreparedTurnHandler
from tests.support.env import environ

STREAM_ONLY_PLUGIN = "tests.support.stream_only"
"""The plugin module that registers the `stream_only` framework (an adapter with only `run`)."""
PORTED_PLUGIN = "tests.support.ported"
"""The plugin module that registers `ported_invoke` and `ported_stream`: plain handlers, written to
`handlers.base.BaseAgentHandler` alone (tests never import it, or its frameworks would stay registered)."""
PORTED_FRAMEWORKS = ("ported_invoke", "ported_stream")


def stream_turn(
    handler: BaseAgentHandler, text: str, images: Sequence[str] | None = None, reply_to: int | None = None
) -> Iterator[StreamEvent]:
    """`handler.stream_turn(turn)` on the input the worker would build for `text` (chatq's adapters)."""
    assert isinstance(handler, PreparedTurnHandler), f"{type(handler).__name__} is not a PreparedTurnHandler"
    return handler.stream_turn(handler.prepare(text, images, reply_to))


@contextmanager
def plugin_installed(module: str, *frameworks: str) -> Iterator[None]:
    """CHATQ_PLUGINS names `module` for the block (chatq imports it when it reads the framework
    registry); afterwards its `frameworks` are unregistered and the module forgotten, so the next
    block imports and registers them again."""
    try:
        with environ(CHATQ_PLUGINS=module):
            yield
    finally:
        for framework in frameworks:
            unregister_framework(framework)
        sys.modules.pop(module, None)

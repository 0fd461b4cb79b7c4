"""chatq's worker package: the Celery app and the producer API at the top, with the modules every room
shares, and four rooms: `runtime` (what a worker runs), `ops` (operating it), `cli` and `gateway`.

Re-exports are resolved lazily so importing one submodule (`worker.producer`, say) stays cheap and
`celery -A worker` still finds the app through `worker.celery`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "app": "worker.app",
    "create_session": "worker.producer",
    "submit_turn": "worker.producer",
    "cancel_turn": "worker.producer",
    "decide_tool_call": "worker.producer",
    "pending_approvals": "worker.producer",
    "Cancellation": "worker.producer",
    "IfBusy": "worker.producer",
    "Settings": "chatq.settings",
    "get_settings": "chatq.settings",
    "ChatqError": "worker.errors",
}

__all__ = [
    "Cancellation",
    "ChatqError",
    "IfBusy",
    "Settings",
    "app",
    "cancel_turn",
    "create_session",
    "decide_tool_call",
    "get_settings",
    "pending_approvals",
    "submit_turn",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

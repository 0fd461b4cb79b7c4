"""Hand-built kombu envelopes, as a producer in another language writes them onto a Redis list."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

GOOD_EMBED: dict[str, Any] = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def envelope(
    kwargs: Any = None,
    *,
    task_id: str | None = None,
    body: Any = None,
    raw_body: str | None = None,
    exchange: str = "",
    routing_key: str = "chatq",
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A protocol-2 `chatq.run_turn` envelope; `body`, `raw_body`, `headers` and `properties` override parts."""
    task_id = task_id or str(uuid.uuid4())
    if body is None:
        body = [[], kwargs if kwargs is not None else {}, GOOD_EMBED]
    text = raw_body if raw_body is not None else json.dumps(body)
    return {
        "body": base64.b64encode(text.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "go",
            "task": "chatq.run_turn",
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "eta": None,
            "expires": None,
            "timelimit": [None, None],
            "argsrepr": "()",
            "kwargsrepr": "{}",
            "origin": "test",
            **(headers or {}),
        },
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": exchange, "routing_key": routing_key},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            **(properties or {}),
        },
    }


def turn_kwargs(turn_id: str, session_id: str, content: str) -> dict[str, Any]:
    """The task's keyword arguments for one turn."""
    return {"turn_id": turn_id, "session_id": session_id, "content": content}


def encoded(item: dict[str, Any]) -> bytes:
    """The item as it sits on the list."""
    return json.dumps(item).encode()

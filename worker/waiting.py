"""Waiting for turns to end, on their replay streams (blocking XREAD), not by polling Postgres.

Postgres is read once before waiting (a turn that has already ended) and once after its terminal
event: every terminal event is published after the turn's end is committed, so the read finds it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis

from worker.errors import WaitTimeout
from worker.events import TERMINAL_TYPES, get_redis, turn_stream
from worker.payload import parse_uuid

__all__ = ["wait_for_ends", "wait_for_turn"]

BLOCK_MS = 1000
"""Longest single blocking read: well under the client's socket timeout."""

FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def wait_for_ends(
    turn_ids: Sequence[uuid.UUID], *, timeout: float, client: redis.Redis | None = None
) -> set[uuid.UUID]:
    """Block until each turn's replay stream has its terminal event, or `timeout` seconds pass.

    Returns the turns whose terminal event arrived (read from the start of each stream, so an
    event published before the call counts).
    """
    client = client or get_redis()
    keys = {turn_stream(turn_id): turn_id for turn_id in turn_ids}
    last: dict[str, str] = dict.fromkeys(keys, "0-0")
    ended: set[uuid.UUID] = set()
    deadline = time.monotonic() + timeout
    while len(ended) < len(keys):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        pending = {key: last[key] for key, turn_id in keys.items() if turn_id not in ended}
        block = max(1, int(min(remaining, BLOCK_MS / 1000) * 1000))
        batches: Any = client.xread(pending, block=block, count=100)  # type: ignore[arg-type]
        for raw_key, entries in batches or []:
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            for entry_id, fields in entries:
                last[key] = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                raw = fields.get(b"event") or fields.get("event")
                if raw is not None and json.loads(raw).get("type") in TERMINAL_TYPES:
                    ended.add(keys[key])
    return ended


def wait_for_turn(
    turn_id: uuid.UUID | str, timeout: float = 120.0, *, tenant: str | None = None, client: redis.Redis | None = None
) -> dict[str, Any]:
    """The turn as stored (`worker.queries.turn_report`) once it has ended: succeeded, failed or cancelled.

    Returns at once for a turn that has already ended; raises WaitTimeout if it has not ended
    within `timeout` seconds, TurnNotFound if it does not exist (or, with `tenant`, is another
    tenant's).
    """
    from worker.queries import turn_report

    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    report = turn_report(turn_uuid, tenant=tenant)
    if report["status"] in FINISHED:
        return report
    wait_for_ends([turn_uuid], timeout=timeout, client=client)
    # After the terminal event, or at the deadline (a replay stream lost with a Redis restart):
    # Postgres has the last word either way.
    report = turn_report(turn_uuid, tenant=tenant)
    if report["status"] not in FINISHED:
        raise WaitTimeout(f"turn {turn_uuid} did not end within {timeout:g} s (it is {report['status']})")
    return report

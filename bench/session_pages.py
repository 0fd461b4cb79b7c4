"""Session lists and history pages: keyset pages deep in a long list against the first page.

50,000 sessions and one session of 10,000 turns (20,000 messages) are written straight into
Postgres with SQLAlchemy core. Figures, each p50 over repeated calls in this process:
- `list_sessions` at depth 40,000 (its cursor reached by walking the pages) against the first page;
- the same depth as `OFFSET 40000` (what keyset pages replace), against the same first page;
- `list_turns`, the oldest page of the 10,000-turn session against its newest page;
- `delete_session` of the 10,000-turn session against one of 10 turns (reported, no limit).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import Block, isolated_services, log, percentile

SESSIONS = 50_000
DEPTH = 40_000
TURNS = 10_000
PAGE = 20


def _fill_sessions(count: int) -> None:
    from sqlalchemy import insert, text

    from models.db import session_scope
    from models.tables import ChatSession

    start = datetime.now(UTC) - timedelta(days=1)
    for base in range(0, count, 5000):
        rows = [
            {
                "id": uuid.uuid4(),
                "agent_framework": "none",
                "model": "echo",
                "metadata_": {"user": f"u{n % 100}"},
                "created_at": start + timedelta(milliseconds=n),
                "last_active_at": start + timedelta(milliseconds=n),
            }
            for n in range(base, min(base + 5000, count))
        ]
        with session_scope() as db:
            db.execute(insert(ChatSession), rows)
    with session_scope() as db:
        db.execute(text("ANALYZE chat_sessions"))


def _fill_turns(session_id: uuid.UUID, turns: int) -> None:
    from sqlalchemy import insert, text, update

    from models.db import session_scope
    from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus

    for base in range(0, turns, 2000):
        ids = [uuid.uuid4() for _ in range(base, min(base + 2000, turns))]
        with session_scope() as db:
            db.execute(
                insert(Turn),
                [
                    {"id": t, "session_id": session_id, "position": base + i, "status": TurnStatus.SUCCEEDED}
                    for i, t in enumerate(ids)
                ],
            )
            messages: list[dict[str, Any]] = []
            for i, t in enumerate(ids):
                position = (base + i) * MESSAGE_POSITION_STRIDE
                messages.append(
                    {"session_id": session_id, "turn_id": t, "position": position, "role": "user", "content": "q"}
                )
                messages.append(
                    {
                        "session_id": session_id,
                        "turn_id": t,
                        "position": position + 1,
                        "role": "assistant",
                        "content": "a",
                    }
                )
            db.execute(insert(ChatMessage), messages)
    with session_scope() as db:
        db.execute(update(ChatSession).where(ChatSession.id == session_id).values(next_turn_position=turns))
        db.execute(text("ANALYZE turns"))
        db.execute(text("ANALYZE chat_messages"))


def _paired_p50_ms(first: Callable[[], object], second: Callable[[], object], reps: int) -> tuple[float, float]:
    """p50 of each call, the two alternating so that a neighbour's load on the machine hits both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(reps + 2):
        for call, out in ((first, times[0]), (second, times[1])):
            t0 = time.perf_counter()
            call()
            if round_ >= 2:  # the first rounds warm the plans and the pages
                out.append((time.perf_counter() - t0) * 1000)
    return percentile(times[0], 50), percentile(times[1], 50)


def _offset_page(offset: int) -> None:
    from sqlalchemy import select

    from models.db import session_scope
    from models.tables import ChatSession

    with session_scope() as db:
        db.execute(
            select(ChatSession)
            .order_by(ChatSession.created_at.desc(), ChatSession.id.desc())
            .offset(offset)
            .limit(PAGE)
        ).all()


def run(quick: bool = False) -> list[Block]:
    reps = 10 if quick else 60
    with isolated_services("pages"):
        from worker.producer import create_session, delete_session, list_sessions, list_turns, submit_turn

        log(f"writing {SESSIONS:,} sessions and a session of {TURNS:,} turns")
        t0 = time.monotonic()
        _fill_sessions(SESSIONS)
        long_session = create_session(framework="none", model="echo")
        _fill_turns(long_session, TURNS)
        log(f"written in {time.monotonic() - t0:.1f} s")

        cursor = None
        walked = 0
        while walked < DEPTH:
            page = list_sessions(limit=1000, cursor=cursor)
            cursor, walked = page.next_cursor, walked + len(page.sessions)
        deep_cursor = cursor
        first_ms, deep_ms = _paired_p50_ms(
            lambda: list_sessions(limit=PAGE), lambda: list_sessions(limit=PAGE, cursor=deep_cursor), reps
        )
        offset_first_ms, offset_deep_ms = _paired_p50_ms(lambda: _offset_page(0), lambda: _offset_page(DEPTH), reps)
        oldest_cursor: str | None = None
        remaining = TURNS - PAGE
        while remaining > 0:  # walk back to the page before the oldest PAGE turns
            step = list_turns(long_session, limit=min(1000, remaining), before=oldest_cursor)
            oldest_cursor, remaining = step.next_cursor, remaining - len(step.turns)
        newest_ms, oldest_ms = _paired_p50_ms(
            lambda: list_turns(long_session, limit=PAGE),
            lambda: list_turns(long_session, limit=PAGE, before=oldest_cursor),
            reps,
        )

        short_session = create_session(framework="none", model="echo")
        for n in range(10):
            submit_turn(short_session, f"turn {n}")
        t0 = time.perf_counter()
        delete_session(short_session)
        short_delete_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        delete_session(long_session)
        long_delete_ms = (time.perf_counter() - t0) * 1000
    details = {
        "sessions": f"first page {first_ms:.2f} ms, keyset at depth {DEPTH:,} {deep_ms:.2f} ms, "
        f"OFFSET {DEPTH:,} {offset_deep_ms:.2f} ms (OFFSET 0 {offset_first_ms:.2f} ms)",
        "turns": f"newest page {newest_ms:.2f} ms, oldest page of {TURNS:,} turns {oldest_ms:.2f} ms",
    }
    return [
        Block(
            name="session_pages.keyset_deep",
            target=f"list_sessions page at depth {DEPTH:,} of {SESSIONS:,} <= 1.5x the first page",
            figure=deep_ms,
            baseline=first_ms,
            baseline_label="first page",
            unit="ms",
            limit=1.5,
            details=details,
        ),
        Block(
            name="session_pages.offset_deep",
            target=f"the same depth as OFFSET {DEPTH:,}, what keyset pages avoid (reported, no limit)",
            figure=offset_deep_ms,
            baseline=first_ms,
            baseline_label="list_sessions first page",
            unit="ms",
            limit=None,
        ),
        Block(
            name="session_pages.oldest_turns",
            target=f"list_turns oldest page of a {TURNS:,}-turn session <= 1.5x its newest page",
            figure=oldest_ms,
            baseline=newest_ms,
            baseline_label="newest page",
            unit="ms",
            limit=1.5,
        ),
        Block(
            name="session_pages.delete_long",
            target=f"delete_session of a {TURNS:,}-turn session vs a 10-turn one (reported, no limit)",
            figure=long_delete_ms,
            baseline=short_delete_ms,
            baseline_label="10-turn session",
            unit="ms",
            limit=None,
        ),
    ]

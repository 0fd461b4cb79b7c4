"""Batch conversations (`chatq batch`): parse, submit in bulk, follow, collect results.

Each conversation becomes one session whose turns run in order on the `chatq.batch` queue, so
they never hold up interactive turns. Ids are derived from the batch id, the conversation id and
the turn index, so running the same command again resumes instead of submitting twice
(`worker.cli.batch_resume` compares an edited file with what was stored).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from chatq.settings import Settings
from handlers import framework_names
from models.db import connection_scope, session_scope
from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus
from worker.cli.batch_resume import Comparison, Found, append_turns, compare, load_stored
from worker.dispatch import send_turns
from worker.errors import InvalidTurn
from worker.events import get_redis
from worker.markers import in_queue
from worker.payload import BATCH_QUEUE, task_message, validate_content, validate_tenant
from worker.store import claims
from worker.store.turns import runs_next
from worker.webhook_urls import validate_webhook

SESSIONS = cast(Table, ChatSession.__table__)
BATCH_NAMESPACE = uuid.UUID("5d0f3c39-1f4e-4c8e-9a53-2b0d0c9e6a71")
FINISHED = (TurnStatus.SUCCEEDED, TurnStatus.FAILED, TurnStatus.CANCELLED)


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """One line of a batch file."""

    line: int
    """Its line number in the file (1-based)."""
    id: str
    """The conversation id from the file."""
    framework: str
    """The session's agent framework."""
    model: str | None
    """The session's model (None: the default model)."""
    system_prompt: str | None
    """The session's instructions."""
    webhook: str | None = None
    """Where each turn of the session is POSTed when it ends (`session.webhook`)."""
    tenant: str | None = None
    """The tenant that owns the session: the line's `tenant`, else `chatq batch --tenant`'s (None: no tenant)."""
    turns: tuple[str, ...]
    """The user messages, in order."""


@dataclass(frozen=True, kw_only=True)
class LineError:
    """A batch line that cannot be run."""

    line: int
    """Its line number (1-based)."""
    message: str
    """What is wrong with it."""

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def parse_line(line_no: int, text: str, settings: Settings, *, tenant: str | None = None) -> Conversation:
    """Validate one batch line; raises InvalidTurn with what is wrong.

    `tenant` is the batch's default (`--tenant`, already checked); a line's own `"tenant"` (a name, or
    null for none) overrides it, as the line is the more specific of the two.
    """
    try:
        # Without its line ending: JSON would count the newline as a line of its own, and report an
        # error at the end of the line as "column 1" (of that second line).
        data = json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        # Some messages end in "at" ("Unterminated string starting at"): one "at" before the column.
        raise InvalidTurn(f"not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise InvalidTurn("must be a JSON object")
    conv_id = data.get("id")
    if not isinstance(conv_id, str | int) or isinstance(conv_id, bool) or not str(conv_id).strip():
        raise InvalidTurn('missing "id" (a non-empty string)')
    session = data.get("session") or {}
    if not isinstance(session, dict):
        raise InvalidTurn('"session" must be an object')
    framework = session.get("framework", "langgraph")
    frameworks = framework_names()  # the registry, with CHATQ_PLUGINS' frameworks
    if framework not in frameworks:
        raise InvalidTurn(f"unknown framework {framework!r}; choose one of: {', '.join(frameworks)}")
    model = session.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > 200):
        raise InvalidTurn('"session.model" must be a model name')
    system_prompt = session.get("system_prompt")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise InvalidTurn('"session.system_prompt" must be a string')
    webhook = validate_webhook(
        session.get("webhook"), allow_private=settings.webhook_allow_private, name='"session.webhook"'
    )
    if "tenant" in data:
        tenant = validate_tenant(data["tenant"])
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InvalidTurn('missing "turns" (a non-empty list of user messages)')
    if len(turns) >= 100_000:
        raise InvalidTurn("too many turns in one conversation")
    checked = []
    for index, turn in enumerate(turns):
        try:
            checked.append(validate_content(turn, settings))
        except InvalidTurn as exc:
            raise InvalidTurn(f"turns[{index}]: {exc.message}") from None
    return Conversation(
        line=line_no,
        id=str(conv_id),
        framework=framework,
        model=model or None,
        system_prompt=system_prompt,
        webhook=webhook,
        tenant=tenant,
        turns=tuple(checked),
    )


def parse_batch(
    lines: Iterable[str], settings: Settings, *, tenant: str | None = None
) -> tuple[list[Conversation], list[LineError]]:
    """Every valid conversation and every bad line (blank lines are skipped), bounded by `settings`;
    `tenant`: each session's unless its line names one (`parse_line`)."""
    conversations: list[Conversation] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            conversation = parse_line(line_no, text, settings, tenant=tenant)
        except InvalidTurn as exc:
            errors.append(LineError(line=line_no, message=exc.message))
            continue
        if conversation.id in seen:
            errors.append(
                LineError(
                    line=line_no, message=f"duplicate id {conversation.id!r} (first on line {seen[conversation.id]})"
                )
            )
            continue
        seen[conversation.id] = line_no
        conversations.append(conversation)
    return conversations, errors


def session_uuid(batch_id: str, conversation_id: str) -> uuid.UUID:
    """The stable session id of a conversation of a batch."""
    return uuid.uuid5(BATCH_NAMESPACE, f"{batch_id}\x1f{conversation_id}")


def turn_uuid(batch_id: str, conversation_id: str, index: int) -> uuid.UUID:
    """The stable turn id of a conversation's turn."""
    return uuid.uuid5(BATCH_NAMESPACE, f"{batch_id}\x1f{conversation_id}\x1f{index}")


@dataclass(frozen=True, kw_only=True)
class Submission:
    """What `submit_batch` did."""

    conversations: int
    """Conversations in the batch."""
    turns: int
    """Turns in the batch."""
    new_turns: int
    """Turns stored by this call (0 when the batch had been submitted before)."""
    sent: int
    """Task messages sent (the first runnable turn of each unfinished conversation)."""
    resumed: int = 0
    """Conversations found stored by an earlier run of the batch (changed ones included)."""
    already_done: int = 0
    """Turns of the conversations that run that had finished before this call."""
    changed: tuple[Comparison, ...] = ()
    """Conversations that differ from what the batch stored: reported, not run."""
    appended: tuple[Comparison, ...] = ()
    """Stored conversations whose new turns at the end this call stored."""


def submit_batch(batch_id: str, conversations: Sequence[Conversation], *, chunk: int = 1000) -> Submission:
    """Store every conversation's session and turns in bulk (resuming what exists), then send.

    A conversation the batch stored before is compared with the file first (`worker.cli.batch_resume`):
    it resumes if unchanged, gets new turns at its end stored, and is left alone if it changed.
    Only the first runnable turn of each conversation is sent: the worker sends a session's next
    turn as soon as the previous one ends, so a 10,000-turn batch costs one message per conversation.
    """
    new_turns = 0
    found: list[Comparison] = []
    for start in range(0, len(conversations), chunk):
        part = conversations[start : start + chunk]
        stored = load_stored([session_uuid(batch_id, c.id) for c in part])
        fresh = [c for c in part if session_uuid(batch_id, c.id) not in stored]
        created = _insert(batch_id, fresh)
        new_turns += sum(len(c.turns) for c in fresh if session_uuid(batch_id, c.id) in created)
        raced = [session_uuid(batch_id, c.id) for c in fresh if session_uuid(batch_id, c.id) not in created]
        if raced:  # a concurrent run of the same batch stored them first
            stored.update(load_stored(raced))
        for conv in part:
            sid = session_uuid(batch_id, conv.id)
            if sid in created:
                continue

            def turn_id(index: int, conv_id: str = conv.id) -> uuid.UUID:
                return turn_uuid(batch_id, conv_id, index)

            comparison = compare(conv, stored[sid], turn_id)
            if comparison.found is Found.APPENDED:
                comparison = append_turns(conv, sid, turn_id)
                new_turns += comparison.appended_turns
            found.append(comparison)
    changed = tuple(c for c in found if c.found is Found.CHANGED)
    skipped = {c.conversation.id for c in changed}
    sent = 0
    session_ids = [session_uuid(batch_id, c.id) for c in conversations if c.id not in skipped]
    for start in range(0, len(session_ids), chunk):
        heads, tenants = _runnable_heads(session_ids[start : start + chunk])
        # On a resumed run, a head whose message still waits in Redis needs no second one.
        waiting = {str(t) for t in in_queue(get_redis(), [uuid.UUID(m["turn_id"]) for m in heads])}
        to_send = [m for m in heads if m["turn_id"] not in waiting]
        sent += send_turns(to_send, queue=BATCH_QUEUE, client=get_redis(), tenants=tenants)
    return Submission(
        conversations=len(conversations),
        turns=sum(len(c.turns) for c in conversations),
        new_turns=new_turns,
        sent=sent,
        resumed=len(found),
        already_done=sum(c.finished_turns for c in found if c.found is not Found.CHANGED),
        changed=changed,
        appended=tuple(c for c in found if c.found is Found.APPENDED and c.appended_turns),
    )


def _insert(batch_id: str, conversations: Sequence[Conversation]) -> set[uuid.UUID]:
    """Store new conversations' sessions, turns and user messages; the ids of the sessions created."""
    if not conversations:
        return set()
    sessions, turns, messages = [], [], []
    for conv in conversations:
        sid = session_uuid(batch_id, conv.id)
        sessions.append(
            {
                "id": sid,
                "agent_framework": conv.framework,
                # None: NULL, the default model of the worker running each turn.
                "model": conv.model,
                "system_prompt": conv.system_prompt,
                "webhook_url": conv.webhook,
                "tenant": conv.tenant,
                "metadata": {"batch": batch_id, "conversation": conv.id},
                "next_turn_position": len(conv.turns),
            }
        )
        for index, content in enumerate(conv.turns):
            tid = turn_uuid(batch_id, conv.id, index)
            turns.append({"id": tid, "session_id": sid, "position": index, "queue": BATCH_QUEUE})
            messages.append(
                {
                    "session_id": sid,
                    "turn_id": tid,
                    "position": index * MESSAGE_POSITION_STRIDE,
                    "role": "user",
                    "content": content,
                }
            )
    # Core executemany (SQLAlchemy's batched "insertmanyvalues"): one cached statement sent in
    # pages, not a 4,000-row VALUES clause compiled afresh for every chunk.
    with connection_scope() as db:
        created = db.execute(
            pg_insert(SESSIONS).on_conflict_do_nothing(index_elements=["id"]).returning(SESSIONS.c.id),
            sessions,
        ).scalars()
        fresh = set(created)
        if not fresh:
            return fresh
        # A session that already existed was stored with all its turns by another run.
        claims.insert_queued_turns(
            db,
            [t for t in turns if t["session_id"] in fresh],
            [m for m in messages if m["session_id"] in fresh],
        )
        return fresh


def _runnable_heads(session_ids: Sequence[uuid.UUID]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Task messages for each session's first unfinished turn that is still queued, and the tenant
    of each that has one (turn id -> tenant: they count as waiting for it, `worker.tenant_queue`)."""
    with session_scope() as db:
        rows = db.execute(
            select(Turn.id, Turn.session_id, ChatMessage.content, ChatSession.tenant)
            .join(ChatMessage, (ChatMessage.turn_id == Turn.id) & (ChatMessage.role == "user"))
            .join(ChatSession, ChatSession.id == Turn.session_id)
            .where(Turn.session_id.in_(session_ids), Turn.status == TurnStatus.QUEUED, runs_next())
        ).all()
    heads = [
        task_message(turn_id=tid, session_id=sid, content=content, images=None, reply_to=None)
        for tid, sid, content, _ in rows
    ]
    return heads, {str(tid): tenant for tid, _, _, tenant in rows if tenant}


@dataclass(kw_only=True)
class TurnState:
    """What the follower knows of one turn."""

    conversation: str
    index: int
    status: str = "queued"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int | None = None
    error: str | None = None


@dataclass(kw_only=True)
class Progress:
    """Counts for the progress bar and the summary."""

    total: int
    done: int = 0
    succeeded: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies_ms: list[int] = field(default_factory=list)


def poll_turns(batch_id: str, conversations: Sequence[Conversation]) -> Iterator[tuple[uuid.UUID, Mapping[str, Any]]]:
    """The current state of every turn of the batch (one query per 1,000 sessions)."""
    session_ids = [session_uuid(batch_id, c.id) for c in conversations]
    for start in range(0, len(session_ids), 1000):
        with session_scope() as db:
            rows = db.execute(
                select(
                    Turn.id,
                    Turn.status,
                    Turn.prompt_tokens,
                    Turn.completion_tokens,
                    Turn.started_at,
                    Turn.finished_at,
                    Turn.error,
                ).where(Turn.session_id.in_(session_ids[start : start + 1000]))
            ).all()
        for row in rows:
            yield row.id, dict(row._mapping)


def latency_ms(started: datetime | None, finished: datetime | None) -> int | None:
    """Run time of a turn, from its first start to its end (retries included)."""
    if started is None or finished is None:
        return None
    return max(0, int((finished - started).total_seconds() * 1000))


def conversation_result(
    batch_id: str, conversation: Conversation, states: Mapping[uuid.UUID, TurnState]
) -> dict[str, Any]:
    """The output line of a finished conversation, with each turn's user text and reply.

    Both texts come from Postgres, so a line always pairs a reply with the message it answered.
    """
    sid = session_uuid(batch_id, conversation.id)
    turn_ids = [turn_uuid(batch_id, conversation.id, i) for i in range(len(conversation.turns))]
    users: dict[uuid.UUID | None, str] = {}
    replies: dict[uuid.UUID | None, str] = {}
    with session_scope() as db:
        rows = db.execute(
            select(ChatMessage.turn_id, ChatMessage.role, ChatMessage.content)
            .where(ChatMessage.turn_id.in_(turn_ids), ChatMessage.role.in_(("user", "assistant")))
            .order_by(ChatMessage.position)
        ).all()
    for tid, role, content in rows:
        if role == "user":
            users.setdefault(tid, content)
        else:
            replies[tid] = content  # the last assistant message is the reply
    turns = []
    for index, tid in enumerate(turn_ids):
        state = states[tid]
        turns.append(
            {
                "turn_id": str(tid),
                "status": state.status,
                "user": users.get(tid, conversation.turns[index]),
                "reply": replies.get(tid) if state.status == "succeeded" else None,
                "usage": {
                    "prompt_tokens": state.prompt_tokens,
                    "completion_tokens": state.completion_tokens,
                    "total_tokens": state.prompt_tokens + state.completion_tokens,
                },
                "latency_ms": state.latency_ms,
                "error": state.error,
            }
        )
    return {"id": conversation.id, "session_id": str(sid), "turns": turns}


def percentile(values: Sequence[int], fraction: float) -> int | None:
    """The nearest-rank percentile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.4999)))
    return ordered[rank - 1]

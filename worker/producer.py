"""The producer API: what the CLI and Python producers call. Imports no agent framework.

`submit_turn` writes the turn as `queued` with its user message in one transaction, then sends
`chatq.run_turn` with task id = turn id. Postgres first means a message lost in Redis is found
again by the sweeper; the reverse order could run a turn that was never recorded.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from redis import RedisError
from sqlalchemy import select, update

from chatq.masking import mask_secrets
from chatq.settings import get_settings
from handlers import framework_names
from models.db import autocommit_scope, get_engine, session_scope
from models.knowledge import attach_knowledge_bases
from models.tables import ChatMessage, ChatSession, Turn, TurnStatus
from worker.approvals import Decided, DecidedCalls
from worker.approvals import decide_tool_call as _decide_tool_call
from worker.approvals import decide_turn as _decide_turn
from worker.approvals import pending_approvals as _pending_approvals
from worker.delays import due_time
from worker.deletion import DeletedSessionReport
from worker.deletion import delete_session as _delete_session
from worker.dispatch import kick_next, send_end_delivery, send_turn
from worker.errors import (
    InvalidTurn,
    NotCancellable,
    SessionBusy,
    SessionNotFound,
    TurnConflict,
    TurnExists,
    TurnNotFound,
)
from worker.event_scripts import add_unended
from worker.events import EventType, TurnEvents, get_redis
from worker.history import SessionPage, TurnPage
from worker.history import get_session as _get_session
from worker.history import list_sessions as _list_sessions
from worker.history import list_turns as _list_turns
from worker.payload import (
    INTERACTIVE_QUEUE,
    QUEUES,
    TurnRequest,
    check_text,
    parse_uuid,
    used_turn_id,
    validate_approval,
    validate_content,
    validate_images,
    validate_metadata,
    validate_model,
    validate_reply_to,
    validate_system_prompt,
    validate_tenant,
)
from worker.schedule_records import Schedule, ScheduleRun
from worker.schedule_times import Misfire, Overlap
from worker.schedules import create_schedule as _create_schedule
from worker.schedules import delete_schedule as _delete_schedule
from worker.schedules import get_schedule as _get_schedule
from worker.schedules import list_schedules as _list_schedules
from worker.schedules import pause_schedule as _pause_schedule
from worker.schedules import resume_schedule as _resume_schedule
from worker.schedules import schedule_runs as _schedule_runs
from worker.schedules import update_schedule as _update_schedule
from worker.schema import explains_missing_schema
from worker.sessions import KEEP, Keep
from worker.sessions import update_session as _update_session
from worker.store import claims, turns
from worker.store.delayed import insert_delayed_turn
from worker.store.turns import NextTurn
from worker.waiting import wait_for_turn as _wait_for_turn
from worker.webhook_urls import validate_webhook

__all__ = [
    "KEEP",
    "Cancellation",
    "Decided",
    "DecidedCalls",
    "DeletedSessionReport",
    "IfBusy",
    "Keep",
    "Misfire",
    "Overlap",
    "Schedule",
    "ScheduleRun",
    "SessionPage",
    "SubmittedTurn",
    "TurnPage",
    "cancel_turn",
    "create_schedule",
    "create_session",
    "decide_tool_call",
    "decide_turn",
    "delete_schedule",
    "delete_session",
    "get_schedule",
    "get_session",
    "list_schedules",
    "list_sessions",
    "list_turns",
    "pause_schedule",
    "pending_approvals",
    "resume_schedule",
    "schedule_runs",
    "submit_turn",
    "update_schedule",
    "update_session",
    "wait_for_turn",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _schema_checked(function: Callable[P, R]) -> Callable[P, R]:
    """`function` raising SchemaMissing, naming this process's database, on a database nobody migrated."""
    return explains_missing_schema(function, where=lambda: get_settings().database_url_masked)


# The API's calls that live in other modules, each raising SchemaMissing (one line: run `chatq db
# upgrade`) on a database nobody migrated, as the calls defined here do (worker.schema).
get_session = _schema_checked(_get_session)
list_sessions = _schema_checked(_list_sessions)
list_turns = _schema_checked(_list_turns)
delete_session = _schema_checked(_delete_session)
wait_for_turn = _schema_checked(_wait_for_turn)
decide_tool_call = _schema_checked(_decide_tool_call)
decide_turn = _schema_checked(_decide_turn)
pending_approvals = _schema_checked(_pending_approvals)
# Schedules (`worker.schedules`; docs/contract.md, "Schedules"): the workers fire them.
list_schedules = _schema_checked(_list_schedules)
get_schedule = _schema_checked(_get_schedule)
pause_schedule = _schema_checked(_pause_schedule)
resume_schedule = _schema_checked(_resume_schedule)
delete_schedule = _schema_checked(_delete_schedule)
schedule_runs = _schema_checked(_schedule_runs)


class IfBusy(enum.StrEnum):
    """What to do when a turn is submitted while the session has unfinished turns."""

    ENQUEUE = "enqueue"
    """Run after the turns before it (the default)."""
    REJECT = "reject"
    """Refuse with SessionBusy; nothing is stored."""
    INTERRUPT = "interrupt"
    """Cancel the session's unfinished turns, then run this one."""


@dataclass(frozen=True, kw_only=True)
class SubmittedTurn:
    """A turn accepted by `submit_turn`."""

    turn_id: uuid.UUID
    """The turn's id (= the Celery task id)."""
    session_id: uuid.UUID
    """Its session."""
    position: int | None
    """Its position in the session; None while it is delayed (it takes the next one when due)."""
    created: bool
    """False when the same turn id had already been submitted (idempotent resubmission)."""
    sent: bool = True
    """False if Redis was unreachable (the sweeper sends the turn later), or the turn is delayed (sent when due)."""
    cancelled: list[uuid.UUID] = field(default_factory=list)
    """Turns cancelled to make way for this one (IfBusy.INTERRUPT)."""
    run_at: datetime | None = None
    """When a delayed turn is due (stored `delayed` until then); None: it was queued at once."""


@_schema_checked
def create_session(
    *,
    framework: str = "langgraph",
    model: str | None = None,
    system_prompt: str | None = None,
    metadata: dict[str, Any] | None = None,
    session_id: uuid.UUID | None = None,
    knowledge_bases: Sequence[str] = (),
    tenant: str | None = None,
    webhook: str | None = None,
    approval: str | Sequence[str] | None = None,
) -> uuid.UUID:
    """Create a chat session and return its id; `knowledge_bases` (names) are attached in the same transaction.

    `tenant` (a scoped gateway token's, CHATQ_API_TOKENS, or any name of `chatq.tenants`' rule) owns
    the session and so its turns: reads scoped to another tenant do not find it.

    Without `model` the session stores none (NULL): each turn runs on the default model of the
    worker that runs it (the worker's CHATQ_MODEL, or what its OPENAI_API_KEY implies). With
    `webhook` (an http(s) URL) each of its turns is POSTed there when it ends, unless the turn
    names its own (docs/contract.md, "Webhooks").
    """
    frameworks = framework_names()  # the registry, with CHATQ_PLUGINS' frameworks
    if framework not in frameworks:
        raise InvalidTurn(f"unknown agent framework {framework!r}; choose one of: {', '.join(frameworks)}")
    settings = get_settings()
    # No model: NULL, so the worker's default applies, not this process's (which may lack the key).
    model = validate_model(model)
    system_prompt = validate_system_prompt(system_prompt, settings)
    stored_metadata = validate_metadata(
        metadata if approval is None else {**(metadata or {}), "approval": validate_approval(approval)}
    )
    webhook_url = validate_webhook(webhook, allow_private=settings.webhook_allow_private)
    tenant = validate_tenant(tenant)
    for name in knowledge_bases:
        if isinstance(name, str):
            check_text(name, "knowledge base name")
    new_id = session_id or uuid.uuid4()
    with session_scope() as db:
        db.add(
            ChatSession(
                id=new_id,
                agent_framework=framework,
                model=model,
                system_prompt=system_prompt,
                metadata_=stored_metadata,
                tenant=tenant,
                webhook_url=webhook_url,
            )
        )
        if knowledge_bases:
            attach_knowledge_bases(new_id, knowledge_bases, db=db)
    log.info("session %s created (framework %s, model %s)", new_id, framework, model or "the worker's default")
    return new_id


@_schema_checked
def submit_turn(
    session_id: uuid.UUID | str,
    content: str,
    *,
    images: Sequence[str] | None = None,
    reply_to: int | None = None,
    turn_id: uuid.UUID | str | None = None,
    queue: str = INTERACTIVE_QUEUE,
    if_busy: IfBusy | str = IfBusy.ENQUEUE,
    webhook: str | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    tenant: str | None = None,
) -> SubmittedTurn:
    """Store a turn as queued (with its user message) and send it to the workers.

    The session must exist (SessionNotFound otherwise: only a raw task message creates one). With
    `tenant`, it must be that tenant's: TenantMismatch, one line and nothing stored, for a session of
    another tenant or of none. The turn belongs to its session's tenant either way.

    With `webhook` (an http(s) URL) the turn is POSTed there when it ends, instead of to its
    session's webhook. With `run_at` (timezone-aware) or `delay` (seconds), not both, the turn is
    stored `delayed` and queued when due, at the end of its session's order then (a time not ahead,
    or a delay of 0, is now). `if_busy` other than enqueue is refused with a delay: the session's
    state at the due time is not known now, and no one would hear of a refusal then.
    """
    settings = get_settings()
    if queue not in QUEUES:
        raise InvalidTurn(f"unknown queue {queue!r}; choose one of: {', '.join(QUEUES)}")
    try:
        busy_policy = IfBusy(if_busy)
    except ValueError:
        raise InvalidTurn(f"unknown if_busy {if_busy!r}; choose one of: {', '.join(IfBusy)}") from None
    request = TurnRequest(
        turn_id=parse_uuid(str(turn_id), "turn_id") if turn_id is not None else uuid.uuid4(),
        session_id=parse_uuid(str(session_id), "session_id"),
        content=validate_content(content, settings),
        images=validate_images(list(images) if images is not None else None, settings),
        reply_to=validate_reply_to(reply_to),
        tenant=validate_tenant(tenant),
    )
    webhook_url = validate_webhook(webhook, allow_private=settings.webhook_allow_private)
    due = due_time(run_at, delay)
    if due is not None:
        if busy_policy is not IfBusy.ENQUEUE:
            raise InvalidTurn(f"if_busy {busy_policy.value} cannot be combined with a delay (only enqueue can)")
        return _submit_delayed(NextTurn(queue=queue, **vars(request)), run_at=due, webhook_url=webhook_url)
    cancelled: list[uuid.UUID] = []
    try:
        if busy_policy is IfBusy.ENQUEUE and webhook_url is None:
            # The common case is one statement, so it needs no transaction around it.
            with autocommit_scope() as conn:
                inserted = claims.insert_queued_turn(conn, request, queue=queue)
        else:
            with session_scope() as db:
                if busy_policy is not IfBusy.ENQUEUE:
                    # The session row lock first: concurrent submits queue up here before looking
                    # at the session's unfinished turns.
                    turns.lock_session(db, request.session_id)
                    # Before any turn is cancelled for it: a turn refused for its tenant changes nothing.
                    turns.check_tenant(db, request.session_id, request.tenant)
                    cancelled = _apply_busy_policy(db, request.session_id, busy_policy)
                inserted = claims.insert_queued_turn(db, request, queue=queue)
                if webhook_url is not None:
                    db.execute(update(Turn).where(Turn.id == request.turn_id).values(webhook_url=webhook_url))
    except TurnExists:
        return _resubmission(request)
    for other_id in cancelled:
        _announce_cancel(other_id)
    client = get_redis()
    events = TurnEvents(
        session_id=request.session_id, turn_id=request.turn_id, client=client, retention=settings.event_retention
    )
    position = inserted.position
    events.publish(EventType.QUEUED, 0, position=position)
    # Its session's tenant, read by the insert: a tenant's batch turn counts as waiting for it (worker.tenant_queue).
    sent = send_turn(request.to_message(), queue=queue, client=client, tenant=inserted.tenant)
    log.info("turn %s session %s: queued at position %d on %s", request.turn_id, request.session_id, position, queue)
    return SubmittedTurn(
        turn_id=request.turn_id,
        session_id=request.session_id,
        position=position,
        created=True,
        sent=sent,
        cancelled=cancelled,
    )


def _submit_delayed(request: NextTurn, *, run_at: datetime, webhook_url: str | None) -> SubmittedTurn:
    """Store a turn as `delayed` until `run_at`; nothing is sent or published until it is due."""
    try:
        with session_scope() as db:
            insert_delayed_turn(db, request, run_at=run_at, webhook_url=webhook_url)
    except TurnExists:
        return _resubmission(request)
    log.info("turn %s session %s: delayed until %s", request.turn_id, request.session_id, run_at.isoformat())
    return SubmittedTurn(
        turn_id=request.turn_id, session_id=request.session_id, position=None, created=True, sent=False, run_at=run_at
    )


def _apply_busy_policy(db: Any, session_id: uuid.UUID, policy: IfBusy) -> list[uuid.UUID]:
    """reject/interrupt against the session's unfinished turns (the caller holds the session lock)."""
    active = list(db.execute(select(Turn.id).where(Turn.session_id == session_id, turns.unfinished())).scalars())
    if active and policy is IfBusy.REJECT:
        raise SessionBusy(f"session {session_id} is busy with {len(active)} unfinished turn(s)")
    _expect_end(active)
    claims.request_cancel(db, active)
    return active


def _expect_end(turn_ids: Sequence[uuid.UUID]) -> None:
    """Before a cancel commits: put its turns in the unended set (`worker.event_scripts`), so the
    sweep publishes their `cancelled` event should this process die before `_announce_cancel`."""
    if not turn_ids:
        return
    try:
        add_unended(get_redis(), turn_ids, now=time.time())
    except RedisError as exc:  # the cancel goes on; only a lost `cancelled` event would stay unrepaired
        log.warning("could not note %d turn(s) as ending: %s", len(turn_ids), mask_secrets(str(exc)))


def _resubmission(request: TurnRequest) -> SubmittedTurn:
    """The same turn id again: fine if it is the same turn (idempotent), an error otherwise."""
    with session_scope() as db:
        existing = db.get(Turn, request.turn_id)
        user = db.execute(
            select(ChatMessage.content).where(ChatMessage.turn_id == request.turn_id, ChatMessage.role == "user")
        ).scalar_one_or_none()
    if existing is None:  # it was there a moment ago: its session was deleted since
        raise SessionNotFound(f"session {request.session_id} does not exist")
    if user is None and existing.pending_input is not None:  # delayed: its message is stored when due
        user = existing.pending_input.get("content")
    if existing.session_id != request.session_id or user != request.content:
        # One answer whoever owns the turn and whatever differs: naming its session (or saying
        # whether it is in this one) would tell a tenant about another tenant's turn.
        raise TurnConflict(used_turn_id(request.turn_id))
    return SubmittedTurn(
        turn_id=existing.id,
        session_id=existing.session_id,
        position=existing.position,
        created=False,
        sent=False,
        run_at=existing.run_at,
    )


def _announce_cancel(turn_id: uuid.UUID) -> None:
    """Publish `cancelled` for a turn that ended without running, and send its webhook (a running
    one does both itself)."""
    with session_scope() as db:
        row = db.get(Turn, turn_id)
        if row is None or row.status is not TurnStatus.CANCELLED:
            return
        session_id = row.session_id
    retention = get_settings().event_retention
    TurnEvents.resume(session_id=session_id, turn_id=turn_id, client=get_redis(), retention=retention).publish(
        EventType.CANCELLED, 0
    )
    try:
        send_end_delivery(turn_id, engine=get_engine())
    except Exception as exc:  # the cancel stands; the sweep sends its webhook's delivery
        log.warning("turn %s: could not queue its webhook delivery: %s", turn_id, mask_secrets(str(exc)))


@dataclass(frozen=True, kw_only=True)
class Cancellation:
    """What `cancel_turn` did."""

    turn_id: uuid.UUID
    """The turn."""
    status: TurnStatus
    """Its status now: `cancelled`, or `running` while its worker stops it (within about a second)."""
    already: bool
    """True: the turn had been cancelled (or asked to stop) before this call, which changed nothing."""


@_schema_checked
def cancel_turn(turn_id: uuid.UUID | str, *, tenant: str | None = None) -> Cancellation:
    """Cancel a queued, delayed or running turn; says whether this call cancelled it or it already was.

    A queued or delayed turn ends `cancelled` at once and never runs (a delayed one stores nothing
    more). A running one is asked to stop: its
    worker notices within about a second, closes the model request it waits on (even one that has
    sent nothing), stores nothing of the turn and ends it. With `tenant`, another tenant's turn is
    not found.
    """
    turn_uuid = parse_uuid(str(turn_id), "turn_id")
    with session_scope() as db:
        query = select(Turn).where(Turn.id == turn_uuid)
        if tenant is not None:
            query = query.where(Turn.session_id.in_(select(ChatSession.id).where(ChatSession.tenant == tenant)))
        row = db.execute(query.with_for_update(of=Turn)).scalar_one_or_none()
        if row is None:
            raise TurnNotFound(f"turn {turn_uuid} does not exist")
        if row.status.finished:
            if row.status is TurnStatus.CANCELLED:
                return Cancellation(turn_id=turn_uuid, status=row.status, already=True)
            raise NotCancellable(f"turn {turn_uuid} has already {row.status.value}")
        if row.cancel_requested:
            return Cancellation(turn_id=turn_uuid, status=row.status, already=True)
        _expect_end([turn_uuid])
        status, session_id = claims.request_cancel(db, [turn_uuid])[turn_uuid], row.session_id
    if status is TurnStatus.CANCELLED:
        _announce_cancel(turn_uuid)
        kick_next(session_id, engine=get_engine(), client=get_redis())
    log.info("turn %s: cancel requested (%s)", turn_uuid, status.value)
    return Cancellation(turn_id=turn_uuid, status=status, already=False)


@_schema_checked
def update_session(
    session_id: uuid.UUID | str,
    *,
    system_prompt: str | Keep | None = KEEP,
    model: str | Keep | None = KEEP,
    metadata: Mapping[str, Any] | Keep | None = KEEP,
    knowledge_bases: Sequence[str] | Keep = KEEP,
    webhook: str | Keep | None = KEEP,
    approval: str | Sequence[str] | Keep = KEEP,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Change what is given and return the session as `get_session` does (`worker.sessions.update_session`)."""
    return _update_session(
        session_id,
        system_prompt=system_prompt,
        model=model,
        metadata=metadata,
        knowledge_bases=knowledge_bases,
        webhook=webhook,
        approval=approval,
        tenant=tenant,
        settings=get_settings(),
    )


@_schema_checked
def create_schedule(
    *,
    content: str,
    session_id: uuid.UUID | str | None = None,
    session_template: Mapping[str, Any] | None = None,
    cron: str | None = None,
    every: float | None = None,
    timezone: str = "UTC",
    overlap: Overlap | str = Overlap.SKIP,
    misfire: Misfire | str = Misfire.ONCE,
    start_at: datetime | str | None = None,
    end_at: datetime | str | None = None,
    max_runs: int | None = None,
    enabled: bool = True,
    name: str | None = None,
    tenant: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Store a schedule the workers fire (`worker.schedules.create_schedule`; docs/contract.md, "Schedules")."""
    return _create_schedule(
        content=content,
        session_id=session_id,
        session_template=session_template,
        cron=cron,
        every=every,
        timezone=timezone,
        overlap=overlap,
        misfire=misfire,
        start_at=start_at,
        end_at=end_at,
        max_runs=max_runs,
        enabled=enabled,
        name=name,
        tenant=tenant,
        now=now,
        settings=get_settings(),
    )


@_schema_checked
def update_schedule(
    schedule_id: uuid.UUID | str,
    *,
    content: str | Keep = KEEP,
    cron: str | Keep | None = KEEP,
    every: float | Keep | None = KEEP,
    timezone: str | Keep = KEEP,
    overlap: Overlap | str | Keep = KEEP,
    misfire: Misfire | str | Keep = KEEP,
    end_at: datetime | str | Keep | None = KEEP,
    max_runs: int | Keep | None = KEEP,
    name: str | Keep | None = KEEP,
    tenant: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Change what is given (`worker.schedules.update_schedule`)."""
    return _update_schedule(
        schedule_id,
        content=content,
        cron=cron,
        every=every,
        timezone=timezone,
        overlap=overlap,
        misfire=misfire,
        end_at=end_at,
        max_runs=max_runs,
        name=name,
        tenant=tenant,
        now=now,
        settings=get_settings(),
    )

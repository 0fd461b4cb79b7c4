"""Running a batch file again: compare each conversation with what the batch stored for it.

Turn ids derive from the batch id, the conversation id and the turn index, so a second run of the
same batch finds the turns of the first. A conversation whose file text still matches them
resumes. One with turns added at its end gets them stored after the stored ones, and they run
next. Any other edit (a turn's text, turns removed, the session's settings) is reported and not
run: running it would pair the file's new texts with the replies to the old ones.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from models.db import session_scope
from models.tables import ChatMessage, ChatSession, Turn, TurnStatus
from worker.payload import BATCH_QUEUE, TurnRequest
from worker.store.claims import insert_turn
from worker.store.turns import lock_session

if TYPE_CHECKING:
    from worker.cli.batch import Conversation

TurnIds = Callable[[int], uuid.UUID]
"""The batch's turn id of a conversation's turn, by index."""


class Found(enum.StrEnum):
    """What a run finds stored for a conversation of its file."""

    NEW = "new"
    """Nothing: it is stored and run now."""
    UNCHANGED = "unchanged"
    """Its turns, as the file has them: it resumes."""
    APPENDED = "appended"
    """The file's first turns, and the file has more: those are stored after them and run."""
    CHANGED = "changed"
    """Something else: it is reported and not run."""


@dataclass(frozen=True, kw_only=True)
class StoredTurn:
    """A turn of a batch conversation as Postgres has it."""

    id: uuid.UUID
    """The turn's id."""
    status: TurnStatus
    """Where it is in its life."""
    content: str | None
    """Its user message (None if the row has none)."""


@dataclass(frozen=True, kw_only=True)
class StoredConversation:
    """A batch conversation's session and turns as Postgres has them."""

    framework: str
    """The session's agent framework."""
    model: str | None
    """The session's model."""
    system_prompt: str | None
    """The session's instructions."""
    tenant: str | None = None
    """The tenant that owns the session."""
    next_position: int
    """The position the session's next turn would take (its turn count, unless turns were added by hand)."""
    turns: tuple[StoredTurn, ...]
    """Its turns in position order."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A conversation of the file against what the batch stored for it."""

    conversation: Conversation
    """The conversation as the file has it."""
    found: Found
    """What was found."""
    reason: str = ""
    """Why it counts as changed (empty otherwise)."""
    stored_turns: int = 0
    """Turns stored before this run."""
    finished_turns: int = 0
    """Of those, turns already finished (succeeded, failed or cancelled) when this run looked."""
    appended_turns: int = 0
    """Turns this run stored after the stored ones."""

    def __str__(self) -> str:
        where = f"line {self.conversation.line}: conversation {self.conversation.id!r}"
        if self.found is Found.CHANGED:
            return f"{where} changed since this batch stored it ({self.reason}); not run"
        if self.found is Found.APPENDED:
            return f"{where}: {self.appended_turns} turn(s) appended; they run after the {self.stored_turns} stored"
        return f"{where}: {self.found.value}"


def load_stored(session_ids: Sequence[uuid.UUID], db: Session | None = None) -> dict[uuid.UUID, StoredConversation]:
    """The stored sessions among `session_ids`, with their turns and user texts (two queries)."""
    if db is None:
        with session_scope() as scoped:
            return load_stored(session_ids, scoped)
    sessions = db.execute(
        select(
            ChatSession.id,
            ChatSession.agent_framework,
            ChatSession.model,
            ChatSession.system_prompt,
            ChatSession.tenant,
            ChatSession.next_turn_position,
        ).where(ChatSession.id.in_(session_ids))
    ).all()
    if not sessions:
        return {}
    turns: dict[uuid.UUID, list[StoredTurn]] = {row.id: [] for row in sessions}
    rows = db.execute(
        select(Turn.session_id, Turn.id, Turn.status, ChatMessage.content)
        .outerjoin(ChatMessage, and_(ChatMessage.turn_id == Turn.id, ChatMessage.role == "user"))
        .where(Turn.session_id.in_(list(turns)))
        .order_by(Turn.session_id, Turn.position)
    ).all()
    for row in rows:
        turns[row.session_id].append(StoredTurn(id=row.id, status=row.status, content=row.content))
    return {
        row.id: StoredConversation(
            framework=row.agent_framework,
            model=row.model,
            system_prompt=row.system_prompt,
            tenant=row.tenant,
            next_position=row.next_turn_position,
            turns=tuple(turns[row.id]),
        )
        for row in sessions
    }


def compare(conversation: Conversation, stored: StoredConversation, turn_id: TurnIds) -> Comparison:
    """Whether the file's conversation is what the batch stored, that plus turns at its end, or changed."""
    reasons = []
    if stored.framework != conversation.framework:
        reasons.append(f"session.framework was {stored.framework!r}")
    # Without a model in the file the session stores none (the worker's default), or, if stored
    # before that, the producer's default of its day; neither is an edit.
    if conversation.model is not None and stored.model != conversation.model:
        reasons.append(f"session.model was {stored.model!r}")
    if stored.system_prompt != conversation.system_prompt:
        reasons.append("session.system_prompt differs")
    if stored.tenant != conversation.tenant:
        reasons.append(f"tenant was {stored.tenant!r}")
    texts = [turn.content for turn in stored.turns]
    differing = [i for i, (old, new) in enumerate(zip(texts, conversation.turns, strict=False)) if old != new]
    if differing:
        shown = ", ".join(f"turns[{i}]" for i in differing[:5]) + (", ..." if len(differing) > 5 else "")
        reasons.append(f"{shown} {'differs' if len(differing) == 1 else 'differ'} from the stored text")
    if len(conversation.turns) < len(texts):
        reasons.append(f"{len(texts) - len(conversation.turns)} turn(s) removed: {len(texts)} were stored")
    foreign = [turn for index, turn in enumerate(stored.turns) if turn.id != turn_id(index)]
    if foreign or stored.next_position != len(stored.turns):
        reasons.append("its session holds turns this batch did not submit")
    finished = sum(1 for turn in stored.turns if turn.status.finished)
    if reasons:
        found, reason = Found.CHANGED, "; ".join(reasons)
    else:
        found, reason = (Found.APPENDED if len(conversation.turns) > len(texts) else Found.UNCHANGED), ""
    return Comparison(
        conversation=conversation, found=found, reason=reason, stored_turns=len(texts), finished_turns=finished
    )


def append_turns(conversation: Conversation, session_id: uuid.UUID, turn_id: TurnIds) -> Comparison:
    """Store the file's turns after the stored ones, under the session's lock; the comparison made there.

    Compared again under the lock: a concurrent run of the same file may have appended them
    already (then the conversation is unchanged), or someone submitted to the session meanwhile.
    """
    with session_scope() as db:
        lock_session(db, session_id)
        comparison = compare(conversation, load_stored([session_id], db)[session_id], turn_id)
        if comparison.found is not Found.APPENDED:
            return comparison
        for index in range(comparison.stored_turns, len(conversation.turns)):
            request = TurnRequest(turn_id=turn_id(index), session_id=session_id, content=conversation.turns[index])
            insert_turn(db, request, queue=BATCH_QUEUE)
    return replace(comparison, appended_turns=len(conversation.turns) - comparison.stored_turns)

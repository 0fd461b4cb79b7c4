"""The `chatq.run_turn` message: parsing and validation of what any producer sends.

Everything a producer controls is checked here, before anything is stored, and every problem
becomes one clear `InvalidTurn` line naming the field. Every edge calls these checks: the task
(`parse_turn_request`), the Python API and so the CLI and the HTTP gateway (`worker.producer`).
What Postgres cannot store (NUL, lone surrogates, integers past a bigint, JSON it refuses) is
refused here, never left for the write to fail (`worker.storable`).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatq import tenants
from chatq.errors import InvalidTenant
from chatq.settings import Settings
from worker.errors import InvalidTurn
from worker.storable import BIGINT_MAX, json_problem, unstorable_char

TASK_NAME = "chatq.run_turn"
INTERACTIVE_QUEUE = "chatq"
BATCH_QUEUE = "chatq.batch"
QUEUES = (INTERACTIVE_QUEUE, BATCH_QUEUE)
WEBHOOK_QUEUE = "chatq.webhooks"
"""The queue of webhook deliveries (`worker.runtime.webhooks.deliveries`); turns cannot be submitted to it."""
GUARDED_QUEUES = (*QUEUES, WEBHOOK_QUEUE)
"""Every queue chatq's workers consume, each item checked before kombu parses it (`worker.runtime.intake.intake`)."""
KNOWN_FIELDS = frozenset({"turn_id", "session_id", "content", "images", "reply_to", "tenant"})
_IMAGE_PREFIXES = ("http://", "https://", "data:image/")
MAX_MODEL_CHARS = 200
"""Longest model name (the `chat_sessions.model` column)."""


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """A validated `chatq.run_turn` message."""

    turn_id: uuid.UUID
    """The turn's id, equal to the Celery task id (the idempotency key)."""
    session_id: uuid.UUID
    """The session the turn belongs to; an unknown one is created with the defaults."""
    content: str
    """The user's message."""
    images: tuple[str, ...] | None = None
    """Images attached to the message: http(s) URLs or `data:image/...` URLs."""
    reply_to: int | None = None
    """A saved user message id: history is taken from before it (regenerate/edit)."""
    tenant: str | None = None
    """The tenant the producer says the session is: a session stored with the turn gets it, an existing
    one must be that tenant's (else TenantMismatch, nothing stored). None: no tenant given, no check.
    Used when the turn is stored, so it is not part of chatq's own messages (stored before they are sent)."""

    def to_message(self) -> dict[str, Any]:
        """The task's keyword arguments, as docs/contract.md ("The task") defines them."""
        return task_message(
            turn_id=self.turn_id,
            session_id=self.session_id,
            content=self.content,
            images=self.images,
            reply_to=self.reply_to,
        )


def task_message(
    *, turn_id: object, session_id: object, content: str, images: Sequence[str] | None, reply_to: int | None
) -> dict[str, Any]:
    """The keyword arguments of `chatq.run_turn`, as docs/contract.md ("The task") defines them."""
    return {
        "turn_id": str(turn_id),
        "session_id": str(session_id),
        "content": content,
        "images": list(images) if images else None,
        "reply_to": reply_to,
    }


def parse_uuid(value: object, field: str) -> uuid.UUID:
    """A UUID from its string form, or InvalidTurn naming the field."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise InvalidTurn(f"{field} must be a UUID string, got {type(value).__name__}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidTurn(f"{field} is not a valid UUID: {value[:60]!r}") from None


def validate_content(content: object, settings: Settings) -> str:
    """The user's text, checked for type, emptiness and size."""
    if not isinstance(content, str):
        raise InvalidTurn(f"content must be a string, got {type(content).__name__}")
    if not content.strip():
        raise InvalidTurn("content is empty")
    if len(content) > settings.max_content_chars:
        raise InvalidTurn(
            f"content is {len(content)} characters, over the limit of {settings.max_content_chars} "
            "(CHATQ_MAX_CONTENT_CHARS)"
        )
    return check_text(content, "content")


def check_text(text: str, field: str) -> str:
    """`text` itself, or InvalidTurn naming the field if it holds a character Postgres cannot store."""
    problem = unstorable_char(text)
    if problem:
        raise InvalidTurn(f"{field} contains {problem}, which cannot be stored; send valid Unicode text without NUL")
    return text


def validate_model(model: object) -> str | None:
    """A session's model name, checked for type, length and storable text; None when empty.

    None is stored as NULL: the worker's default model, decided by the environment of the worker
    that runs each turn, never by the producer's (`Settings.session_model`).
    """
    if model is not None and not isinstance(model, str):
        raise InvalidTurn(f"model must be a string, got {type(model).__name__}")
    name = (model or "").strip()
    if not name:
        return None
    if len(name) > MAX_MODEL_CHARS:
        raise InvalidTurn(f"model name is longer than {MAX_MODEL_CHARS} characters")
    return check_text(name, "model")


def validate_system_prompt(system_prompt: object, settings: Settings) -> str | None:
    """A session's own instructions, or None; checked like a user message."""
    if system_prompt is None:
        return None
    if not isinstance(system_prompt, str):
        raise InvalidTurn(f"system_prompt must be a string, got {type(system_prompt).__name__}")
    if len(system_prompt) > settings.max_content_chars:
        raise InvalidTurn("system_prompt is over CHATQ_MAX_CONTENT_CHARS")
    return check_text(system_prompt, "system_prompt")


def validate_metadata(metadata: object) -> dict[str, Any]:
    """A session's metadata: a JSON object Postgres can store (string keys, storable text, bounded depth)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidTurn(f"metadata must be an object or null, got {type(metadata).__name__}")
    problem = json_problem(metadata)
    if problem:
        raise InvalidTurn(f"metadata {problem}")
    checked = dict(metadata)
    if "approval" in checked:
        checked["approval"] = validate_approval(checked["approval"])
    timeout = checked.get("approval_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise InvalidTurn("metadata approval_timeout must be a number of seconds above 0")
    return checked


def validate_approval(value: object) -> str | list[str]:
    """A session's `approval` (`handlers.approvals`): none, paid, all or a list of tool names."""
    from handlers.approvals import parse_approval

    try:
        return parse_approval(value)
    except ValueError as exc:
        raise InvalidTurn(str(exc)) from None


def validate_images(images: object, settings: Settings) -> tuple[str, ...] | None:
    """Attached images, checked for count, form and decoded size."""
    if images is None:
        return None
    if not isinstance(images, Sequence) or isinstance(images, str | bytes):
        raise InvalidTurn(f"images must be a list of URLs or null, got {type(images).__name__}")
    if len(images) > settings.max_images:
        raise InvalidTurn(f"{len(images)} images attached, over the limit of {settings.max_images} (CHATQ_MAX_IMAGES)")
    checked: list[str] = []
    for index, image in enumerate(images):
        if not isinstance(image, str) or not image.startswith(_IMAGE_PREFIXES):
            raise InvalidTurn(f"images[{index}] must be an http(s) URL or a data:image/... URL")
        if image.startswith("data:"):
            header, _, data = image.partition(",")
            if ";base64" not in header or not data:
                raise InvalidTurn(f"images[{index}] must be a base64 data URL")
            if len(data) * 3 // 4 > settings.max_image_bytes:
                raise InvalidTurn(
                    f"images[{index}] is over the limit of {settings.max_image_bytes} bytes (CHATQ_MAX_IMAGE_BYTES)"
                )
            check_text(header, f"images[{index}]")
            try:
                # All of it (bounded by the size check above): one C pass, a few ms for 5 MB.
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidTurn(f"images[{index}] is not valid base64") from None
        elif len(image) > 4096:
            raise InvalidTurn(f"images[{index}] URL is too long")
        else:
            check_text(image, f"images[{index}]")
        checked.append(image)
    return tuple(checked)


def validate_tenant(tenant: object) -> str | None:
    """A session's tenant (the one rule of `chatq.tenants`), or None when not given."""
    if tenant is None:
        return None
    try:
        return tenants.validate_tenant(tenant)
    except InvalidTenant as exc:
        # Bad input like any other field's: the producer's and the task's one InvalidTurn line.
        raise InvalidTurn(exc.message) from None


def validate_reply_to(reply_to: object) -> int | None:
    """A message id (a positive Postgres bigint) or None."""
    if reply_to is None:
        return None
    if isinstance(reply_to, bool) or not isinstance(reply_to, int) or not 0 < reply_to <= BIGINT_MAX:
        raise InvalidTurn(f"reply_to must be a message id from 1 to {BIGINT_MAX}, or null")
    return reply_to


def parse_turn_request(kwargs: Mapping[str, Any], *, settings: Settings, task_id: str | None = None) -> TurnRequest:
    """Validate a task message's keyword arguments; raises InvalidTurn with one clear line.

    The task id is the turn id by contract, so a message without `turn_id` (a plain Celery client's
    ordinary call, such as celery-node's `applyAsync([], {session_id, content})`) uses the task id;
    when both are given they must be equal. `settings` (the runtime's) bound the content and images.
    """
    if not isinstance(kwargs, Mapping):
        raise InvalidTurn(f"the task's keyword arguments must be an object, got {type(kwargs).__name__}")
    required = ("session_id", "content") if task_id is not None else ("turn_id", "session_id", "content")
    missing = [name for name in required if name not in kwargs]
    if missing:
        raise InvalidTurn(f"missing field(s): {', '.join(missing)}")
    if "turn_id" not in kwargs:
        turn_id = parse_uuid(task_id, "the task id (used as the turn id when turn_id is not given)")
    else:
        turn_id = parse_uuid(kwargs["turn_id"], "turn_id")
        if task_id is not None and str(turn_id) != str(task_id):
            raise InvalidTurn(f"turn_id {turn_id} does not match the task id {str(task_id)[:60]!r}")
    return TurnRequest(
        turn_id=turn_id,
        session_id=parse_uuid(kwargs["session_id"], "session_id"),
        content=validate_content(kwargs["content"], settings),
        images=validate_images(kwargs.get("images"), settings),
        reply_to=validate_reply_to(kwargs.get("reply_to")),
        tenant=validate_tenant(kwargs.get("tenant")),
    )


def used_turn_id(turn_id: object) -> str:
    """The producer's one line (409 on the gateway) for a turn id already used by another turn.

    The same whoever owns that turn: it names no session and does not say what differs."""
    return f"turn {turn_id} already exists: a turn id names one turn; use a new id"


def session_conflict(turn_id: object, *, stored_session: object, given_session: object) -> str:
    """The worker's line for a raw message naming a turn id of another session (logged and rejected)."""
    return (
        f"turn {turn_id} already exists in session {stored_session}, not in session {given_session}: "
        "a turn id names one turn; use a new id"
    )


def redacted_kwargs(message: Mapping[str, Any]) -> str:
    """What Flower and task logs show instead of the message: ids and sizes, never user content."""
    content = message.get("content")
    images = message.get("images")
    shown = {
        "turn_id": message.get("turn_id"),
        "session_id": message.get("session_id"),
        "content": f"<{len(content)} chars>" if isinstance(content, str) else "<invalid>",
        "images": len(images) if isinstance(images, list) else None,
        "reply_to": message.get("reply_to"),
    }
    return repr(shown)

"""The `chatq.run_turn` message: parsing and validation of what any producer sends.

Everything a producer controls is checked here, before anything is stored, and every problem
becomes one clear `InvalidTurn` line.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.config import Settings, get_settings
from worker.errors import InvalidTurn

TASK_NAME = "chatq.run_turn"
INTERACTIVE_QUEUE = "chatq"
BATCH_QUEUE = "chatq.batch"
QUEUES = (INTERACTIVE_QUEUE, BATCH_QUEUE)
KNOWN_FIELDS = frozenset({"turn_id", "session_id", "content", "images", "reply_to"})
_IMAGE_PREFIXES = ("http://", "https://", "data:image/")


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


def validate_content(content: object, settings: Settings | None = None) -> str:
    """The user's text, checked for type, emptiness and size."""
    settings = settings or get_settings()
    if not isinstance(content, str):
        raise InvalidTurn(f"content must be a string, got {type(content).__name__}")
    if not content.strip():
        raise InvalidTurn("content is empty")
    if len(content) > settings.max_content_chars:
        raise InvalidTurn(
            f"content is {len(content)} characters, over the limit of {settings.max_content_chars} "
            "(CHATQ_MAX_CONTENT_CHARS)"
        )
    if "\x00" in content:
        raise InvalidTurn("content contains a NUL character")
    return content


def validate_images(images: object, settings: Settings | None = None) -> tuple[str, ...] | None:
    """Attached images, checked for count, form and decoded size."""
    settings = settings or get_settings()
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
            try:
                base64.b64decode(data[:4096], validate=True)
            except (binascii.Error, ValueError):
                raise InvalidTurn(f"images[{index}] is not valid base64") from None
        elif len(image) > 4096:
            raise InvalidTurn(f"images[{index}] URL is too long")
        checked.append(image)
    return tuple(checked)


def validate_reply_to(reply_to: object) -> int | None:
    """A message id or None."""
    if reply_to is None:
        return None
    if isinstance(reply_to, bool) or not isinstance(reply_to, int) or reply_to <= 0:
        raise InvalidTurn("reply_to must be a positive message id or null")
    return reply_to


def parse_turn_request(
    kwargs: Mapping[str, Any], *, task_id: str | None = None, settings: Settings | None = None
) -> TurnRequest:
    """Validate a task message's keyword arguments; raises InvalidTurn with one clear line."""
    if not isinstance(kwargs, Mapping):
        raise InvalidTurn("the task's keyword arguments must be an object")
    missing = [name for name in ("turn_id", "session_id", "content") if name not in kwargs]
    if missing:
        raise InvalidTurn(f"missing field(s): {', '.join(missing)}")
    turn_id = parse_uuid(kwargs["turn_id"], "turn_id")
    if task_id is not None and str(turn_id) != str(task_id):
        raise InvalidTurn(f"turn_id {turn_id} does not match the task id {str(task_id)[:60]}")
    return TurnRequest(
        turn_id=turn_id,
        session_id=parse_uuid(kwargs["session_id"], "session_id"),
        content=validate_content(kwargs["content"], settings),
        images=validate_images(kwargs.get("images"), settings),
        reply_to=validate_reply_to(kwargs.get("reply_to")),
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

"""What may enter the worker from a Redis queue: one check of a raw list item, envelope to embed.

chatq invites producers in any language onto shared Redis lists, so each item is untrusted input.
kombu and Celery trust what they pop: an envelope field of the wrong type, a body that is not
Celery's three-element list, or an embed they cannot use raises inside the consumer loop (the
worker exits) or leaves the message neither run nor acknowledged (the worker wedges). `inspect`
looks at an item before kombu does and either accepts it, as the payload kombu would have parsed,
or refuses it with a one-line reason that quotes none of its content. `worker.runtime.intake.broker` acts on
the answer.

Accepted items are what Celery's task protocol 2 says, for one of chatq's own tasks, as JSON,
uncompressed (a compressed body could expand to any size before any check), within a size bound
derived from the turn limits. Their `delivery_info` is rewritten to the queue they were actually
popped from, whatever the producer wrote: kombu restores unacknowledged messages and Celery
republishes retries by it, so a producer's stray exchange name must never route a copy elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kombu.serialization import registry  # type: ignore[attr-defined]

from chatq.settings import Settings
from worker.errors import MessageRefused

__all__ = ["Accepted", "Refused", "inspect", "max_item_bytes"]

_ENVELOPE_SLACK = 64 * 1024
"""Bytes allowed beyond the content and images: headers, ids, JSON and base64 overhead."""
_ID_CHARS = 255
_CANVAS_FIELDS = ("callbacks", "errbacks", "chain")


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """An item that may go on to kombu."""

    payload: dict[str, Any]
    """The parsed envelope, with `properties.delivery_info` naming the queue it came from."""


@dataclass(frozen=True, kw_only=True)
class Refused:
    """An item to set aside, never delivered."""

    reason: str
    """Why, in one line that quotes none of the item's content."""
    turn_id: uuid.UUID | None = None
    """The turn the item names, when its task id is a UUID (and its body does not contradict it)."""
    session_id: uuid.UUID | None = None
    """The session the item names, when its keyword arguments hold a UUID session_id."""


def max_item_bytes(settings: Settings) -> int:
    """The largest queue item a turn within the configured limits can need."""
    # Worst cases: every character JSON-escaped (\\uXXXX, twice for a surrogate pair) and images
    # inline as base64; the whole body is base64 again inside the envelope.
    body = settings.max_content_chars * 12 + settings.max_images * (settings.max_image_bytes * 4 // 3 + 1024)
    return (body + _ENVELOPE_SLACK) * 4 // 3 + _ENVELOPE_SLACK


def inspect(raw: bytes | str, *, queue: str, tasks: Collection[str], limit: int) -> Accepted | Refused:
    """Check one item popped from `queue`: accepted for kombu, or refused with the reason."""
    ids: dict[str, uuid.UUID | None] = {"turn_id": None, "session_id": None}
    try:
        payload = _envelope(raw, limit)
        headers = _mapping(payload.get("headers"), "headers")
        properties = _mapping(payload.get("properties"), "properties")
        ids["turn_id"] = _uuid_or_none(headers.get("id"))
        _check_properties(properties)
        _check_content_type(payload, headers)
        body = _body(payload["body"], properties.get("body_encoding"), limit)
        if isinstance(body, list) and len(body) >= 2 and isinstance(body[1], Mapping):
            ids["session_id"] = _uuid_or_none(body[1].get("session_id"))
            _contradiction(ids, body[1].get("turn_id"))
        _check_headers(headers, tasks)
        _check_body(body)
    except MessageRefused as refusal:
        return Refused(reason=refusal.message, **ids)
    properties["delivery_info"] = {"exchange": "", "routing_key": queue}
    return Accepted(payload=payload)


def _envelope(raw: bytes | str, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise MessageRefused(f"the item is {len(raw)} bytes, over the limit of {limit}")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise MessageRefused(f"the item is not UTF-8 (byte {exc.start})") from None
    payload = _json(text, "the item")
    if not isinstance(payload, dict):
        raise MessageRefused(f"the item is {_kind(payload)}, not a kombu envelope (a JSON object)")
    if not isinstance(payload.get("body"), str):
        raise MessageRefused(f"the envelope's body is {_kind(payload.get('body'))}, not a string")
    return payload


def _check_properties(properties: Mapping[str, Any]) -> None:
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not tag or len(tag) > _ID_CHARS:
        raise MessageRefused("properties.delivery_tag must be a non-empty string")
    encoding = properties.get("body_encoding")
    if encoding not in (None, "base64"):
        raise MessageRefused("properties.body_encoding must be base64 (or absent)")
    priority = properties.get("priority")
    if priority is not None and (not _is_int(priority) or not 0 <= priority <= 255):
        raise MessageRefused("properties.priority must be an integer from 0 to 255")
    for name in ("reply_to", "correlation_id"):
        if properties.get(name) is not None and not isinstance(properties[name], str):
            raise MessageRefused(f"properties.{name} must be a string")


def _check_content_type(payload: Mapping[str, Any], headers: Mapping[str, Any]) -> None:
    content_type = payload.get("content-type")
    if content_type != "application/json":
        if isinstance(content_type, str):
            name = registry.type_to_name.get(content_type, content_type[:100])
            raise MessageRefused(f"content type {name!r} is not accepted: chatq takes JSON only")
        raise MessageRefused(f"content-type must be application/json, got {_kind(content_type)}")
    encoding = payload.get("content-encoding")
    if encoding is not None and (not isinstance(encoding, str) or encoding.lower() not in ("utf-8", "utf8")):
        raise MessageRefused("content-encoding must be utf-8")
    if headers.get("compression") is not None:
        # Refused rather than capped: a bomb's size is only known by expanding it.
        raise MessageRefused("compressed messages are not accepted")


def _body(body: str, encoding: str | None, limit: int) -> Any:
    if encoding == "base64":
        try:
            data = base64.b64decode(body.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error):
            raise MessageRefused("the body is not valid base64") from None
        try:
            body = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MessageRefused(f"the decoded body is not UTF-8 (byte {exc.start})") from None
    if len(body) > limit:
        raise MessageRefused(f"the body is over the limit of {limit} bytes")
    return _json(body, "the body")


def _check_headers(headers: Mapping[str, Any], tasks: Collection[str]) -> None:
    task = headers.get("task")
    if task is None:
        raise MessageRefused("not a Celery protocol 2 message (no task header)")
    if not isinstance(task, str) or task not in tasks:
        name = task[:100] if isinstance(task, str) else _kind(task)
        raise MessageRefused(f"unknown task {name!r} (this worker runs {', '.join(sorted(tasks))})")
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not task_id or len(task_id) > _ID_CHARS:
        raise MessageRefused("the id header must be a non-empty string of at most 255 characters")
    for name in ("shadow", "root_id", "parent_id", "group", "argsrepr", "kwargsrepr", "origin", "lang", "meth"):
        if headers.get(name) is not None and not isinstance(headers[name], str):
            raise MessageRefused(f"the {name} header must be a string, got {_kind(headers[name])}")
    for name in ("eta", "expires"):
        if headers.get(name) is not None:
            _check_time(headers[name], name)
    retries = headers.get("retries")
    if retries is not None and (not _is_int(retries) or retries < 0):
        raise MessageRefused("the retries header must be a non-negative integer")
    if headers.get("ignore_result") is not None and not isinstance(headers["ignore_result"], bool):
        raise MessageRefused("the ignore_result header must be true or false")
    _check_timelimit(headers.get("timelimit"))


def _check_time(value: Any, name: str) -> None:
    if not isinstance(value, str):
        raise MessageRefused(f"the {name} header must be an ISO 8601 time, got {_kind(value)}")
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise MessageRefused(f"the {name} header is not an ISO 8601 time") from None


def _check_timelimit(value: Any) -> None:
    if value is None:
        return
    if (
        not isinstance(value, list)
        or len(value) != 2
        or any(v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < 0) for v in value)
    ):
        raise MessageRefused("the timelimit header must be [soft, hard], each a number of seconds or null")


def _check_body(body: Any) -> None:
    if not isinstance(body, list) or len(body) != 3:
        shape = f"a list of {len(body)}" if isinstance(body, list) else _kind(body)
        raise MessageRefused(f"the body must be Celery's [args, kwargs, embed], got {shape}")
    args, kwargs, embed = body
    if not isinstance(args, list):
        raise MessageRefused(f"the task's positional arguments must be a list, got {_kind(args)}")
    if not isinstance(kwargs, dict):
        raise MessageRefused(f"the task's keyword arguments must be an object, got {_kind(kwargs)}")
    if not isinstance(embed, dict):
        raise MessageRefused(f"the body's embed must be an object, got {_kind(embed)}")
    # chatq's tasks end by storing their outcome; they take part in no canvas, and a malformed
    # one is what leaves Celery's request neither run nor acknowledged.
    if any(embed.get(name) not in (None, []) for name in _CANVAS_FIELDS) or embed.get("chord") is not None:
        raise MessageRefused("chatq's tasks take no callbacks, errbacks, chain or chord")


def _contradiction(ids: dict[str, uuid.UUID | None], body_turn_id: Any) -> None:
    """A body naming another turn than its task id: trust neither for the error event."""
    if body_turn_id is not None and _uuid_or_none(body_turn_id) != ids["turn_id"]:
        ids["turn_id"] = ids["session_id"] = None


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MessageRefused(f"{what} is not JSON ({exc.msg} at character {exc.pos})") from None
    except RecursionError:
        raise MessageRefused(f"{what} is JSON nested too deeply") from None


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None and name == "headers":
        raise MessageRefused("not a Celery protocol 2 message (no headers)")
    if not isinstance(value, dict):
        raise MessageRefused(f"the envelope's {name} must be an object, got {_kind(value)}")
    return value


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """A value's JSON type, for messages (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__

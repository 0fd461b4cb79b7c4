"""worker/runtime/intake/intake.py: which raw queue items may reach kombu and Celery, and why the others may not."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from chatq.settings import load_settings
from tests.support.envelopes import GOOD_EMBED, encoded, envelope, turn_kwargs
from worker.runtime.intake.intake import Accepted, Refused, inspect, max_item_bytes

TASKS = frozenset({"chatq.run_turn", "chatq.sweep"})
LIMIT = 1_000_000


def _check(item: bytes | str, queue: str = "chatq") -> Accepted | Refused:
    return inspect(item, queue=queue, tasks=TASKS, limit=LIMIT)


def _ids() -> tuple[str, str]:
    return str(uuid.uuid4()), str(uuid.uuid4())


def test_a_good_message_is_accepted_and_routed_by_the_queue_it_came_from() -> None:
    turn_id, session_id = _ids()
    item = envelope(turn_kwargs(turn_id, session_id, "hi"), task_id=turn_id, exchange="celery", routing_key="x")
    verdict = _check(encoded(item), queue="chatq.batch")
    assert isinstance(verdict, Accepted)
    assert verdict.payload["properties"]["delivery_info"] == {"exchange": "", "routing_key": "chatq.batch"}
    assert verdict.payload["headers"]["id"] == turn_id


def _with(item: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    target = item
    for key in parents:
        target = target[key]
    target[last] = value
    return item


def _body(value: Any) -> dict[str, Any]:
    return envelope(body=value)


BAD: list[tuple[str, Any, str]] = [
    # The reported crash: a body of two elements (no embed).
    ("two elements", lambda t, s: _body([[], turn_kwargs(t, s, "x")]), "got a list of 2"),
    ("a dict body", lambda t, s: _body({"task": "chatq.run_turn", "kwargs": {}}), "got an object"),
    ("a string body", lambda t, s: _body("hello"), "got a string"),
    ("four elements", lambda t, s: _body([[], {}, GOOD_EMBED, 1]), "got a list of 4"),
    ("kwargs a list", lambda t, s: _body([[], ["x"], GOOD_EMBED]), "keyword arguments must be an object"),
    ("args a dict", lambda t, s: _body([{}, {}, GOOD_EMBED]), "positional arguments must be a list"),
    ("embed a list", lambda t, s: _body([[], turn_kwargs(t, s, "x"), []]), "embed must be an object"),
    ("chain a string", lambda t, s: _body([[], turn_kwargs(t, s, "x"), {"chain": "x"}]), "no callbacks"),
    ("a callback", lambda t, s: _body([[], turn_kwargs(t, s, "x"), {"callbacks": [{"a": 1}]}]), "no callbacks"),
    ("a chord", lambda t, s: _body([[], turn_kwargs(t, s, "x"), {"chord": {}}]), "no callbacks"),
    ("headers a list", lambda t, s: _with(envelope({}), "headers", []), "headers must be an object"),
    ("no headers", lambda t, s: _with(envelope({}), "headers", None), "no headers"),
    ("properties a string", lambda t, s: _with(envelope({}), "properties", "p"), "properties must be an object"),
    ("delivery tag a number", lambda t, s: _with(envelope({}), "properties.delivery_tag", 7), "delivery_tag"),
    ("priority a string", lambda t, s: _with(envelope({}), "properties.priority", "high"), "priority"),
    ("body a number", lambda t, s: _with(envelope({}), "body", 12), "body is a number"),
    ("body not base64", lambda t, s: _with(envelope({}), "body", "!!!"), "not valid base64"),
    (
        "body not UTF-8",
        lambda t, s: _with(envelope({}), "body", base64.b64encode(b"\xff\xfe").decode()),
        "decoded body is not UTF-8",
    ),
    ("body not JSON", lambda t, s: envelope(raw_body="{nope"), "the body is not JSON"),
    ("body nested deep", lambda t, s: envelope(raw_body="[" * 100_000), "the body is"),
    ("encoding unknown", lambda t, s: _with(envelope({}), "properties.body_encoding", "rot13"), "body_encoding"),
    ("compressed", lambda t, s: envelope({}, headers={"compression": "application/x-gzip"}), "compressed"),
    ("pickle", lambda t, s: _with(envelope({}), "content-type", "application/x-python-serialize"), "'pickle'"),
    ("no task header", lambda t, s: _with(envelope({}), "headers", {"id": t}), "protocol 2"),
    ("unknown task", lambda t, s: envelope({}, headers={"task": "chatq.nope"}), "unknown task 'chatq.nope'"),
    ("task a number", lambda t, s: envelope({}, headers={"task": 7}), "unknown task 'a number'"),
    ("id a number", lambda t, s: envelope({}, headers={"id": 12}), "id header"),
    ("eta a number", lambda t, s: envelope({}, headers={"eta": 5}), "eta header must be an ISO 8601 time"),
    ("expires a word", lambda t, s: envelope({}, headers={"expires": "tomorrow"}), "expires header is not"),
    ("retries a string", lambda t, s: envelope({}, headers={"retries": "1"}), "retries header"),
    ("timelimit a string", lambda t, s: envelope({}, headers={"timelimit": "x"}), "timelimit header"),
    ("argsrepr a list", lambda t, s: envelope({}, headers={"argsrepr": []}), "argsrepr header must be a string"),
]


@pytest.mark.parametrize(("name", "make", "fragment"), BAD, ids=[case[0] for case in BAD])
def test_malformed_envelopes_are_refused_with_one_line_that_quotes_no_content(
    name: str, make: Any, fragment: str
) -> None:
    turn_id, session_id = _ids()
    item = make(turn_id, session_id)
    verdict = _check(encoded(item))
    assert isinstance(verdict, Refused), name
    assert fragment in verdict.reason, verdict.reason
    assert "\n" not in verdict.reason and len(verdict.reason) < 300


@pytest.mark.parametrize(
    "raw",
    [b"\x00not json at all", b"\xff\xfe", b"[1, 2]", b'"a string"', b"", b"{" * 10, b'{"body": 1}'],
)
def test_items_that_are_no_envelope_are_refused(raw: bytes) -> None:
    verdict = _check(raw)
    assert isinstance(verdict, Refused)
    assert verdict.turn_id is None and verdict.session_id is None


def test_ids_are_trusted_only_when_they_are_uuids_and_agree() -> None:
    turn_id, session_id = _ids()
    two = envelope(body=[[], turn_kwargs(turn_id, session_id, "x")], task_id=turn_id)
    verdict = _check(encoded(two))
    assert isinstance(verdict, Refused)
    assert (verdict.turn_id, verdict.session_id) == (uuid.UUID(turn_id), uuid.UUID(session_id))

    other = envelope(body=[[], turn_kwargs(str(uuid.uuid4()), session_id, "x")], task_id=turn_id)
    verdict = _check(encoded(other))
    assert isinstance(verdict, Refused) and verdict.turn_id is None and verdict.session_id is None

    not_uuid = envelope(body=[[], {"session_id": "nope"}], task_id="task-7")
    verdict = _check(encoded(not_uuid))
    assert isinstance(verdict, Refused) and verdict.turn_id is None and verdict.session_id is None


def test_size_is_bounded_before_anything_is_parsed() -> None:
    item = encoded(envelope({"content": "x" * 2000}))
    verdict = inspect(item, queue="chatq", tasks=TASKS, limit=1000)
    assert isinstance(verdict, Refused) and "over the limit of 1000" in verdict.reason
    assert isinstance(inspect(item, queue="chatq", tasks=TASKS, limit=len(item)), Accepted)


def test_the_size_bound_fits_the_largest_turn_the_settings_allow() -> None:
    settings = load_settings({"CHATQ_MAX_CONTENT_CHARS": "1000", "CHATQ_MAX_IMAGES": "1"})
    biggest = {"content": "\U0001f600" * 1000, "images": ["data:image/png;base64," + "A" * settings.max_image_bytes]}
    item = json.dumps(envelope(biggest)).encode()
    assert len(item) <= max_item_bytes(settings)


def test_a_plain_celery_client_message_without_turn_id_is_accepted() -> None:
    # celery-node's applyAsync: random task id, kwargs without turn_id, embed with nulls.
    session_id = str(uuid.uuid4())
    verdict = _check(encoded(envelope({"session_id": session_id, "content": "hi"})))
    assert isinstance(verdict, Accepted)

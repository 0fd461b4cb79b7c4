from __future__ import annotations

import base64
import uuid

import pytest

from chatq.settings import load_settings
from worker.errors import InvalidTurn
from worker.payload import (
    parse_turn_request,
    redacted_kwargs,
    validate_metadata,
    validate_model,
    validate_system_prompt,
)

SETTINGS = load_settings({"CHATQ_MAX_CONTENT_CHARS": "50", "CHATQ_MAX_IMAGES": "2", "CHATQ_MAX_IMAGE_BYTES": "30"})
TURN, SESSION = str(uuid.uuid4()), str(uuid.uuid4())


def parse(**fields: object) -> object:
    body = {"turn_id": TURN, "session_id": SESSION, "content": "hi", **fields}
    return parse_turn_request({k: v for k, v in body.items() if v is not ...}, task_id=TURN, settings=SETTINGS)


def test_a_valid_message_parses() -> None:
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG....").decode()
    request = parse(images=[png, "https://example.test/cat.jpg"], reply_to=7)
    assert str(request.turn_id) == TURN and str(request.session_id) == SESSION
    assert request.images == (png, "https://example.test/cat.jpg") and request.reply_to == 7
    assert request.to_message()["content"] == "hi"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"content": ...}, "missing field(s): content"),
        ({"content": None}, "content must be a string"),
        ({"content": ""}, "content is empty"),
        ({"content": "x" * 51}, "51 characters, over the limit of 50"),
        ({"content": "a\x00b"}, "NUL"),
        ({"turn_id": "nope"}, "turn_id is not a valid UUID"),
        ({"turn_id": str(uuid.uuid4())}, "does not match the task id"),
        ({"session_id": 5}, "session_id must be a UUID string"),
        ({"images": "cat.png"}, "images must be a list"),
        ({"images": ["a", "b", "c"]}, "3 images attached, over the limit of 2"),
        ({"images": ["file:///etc/passwd"]}, "images[0] must be an http(s) URL"),
        ({"images": ["data:image/png;base64," + "A" * 80]}, "over the limit of 30 bytes"),
        ({"images": ["data:image/png;base64,@@@@"]}, "not valid base64"),
        ({"reply_to": True}, "reply_to must be a message id from 1 to 9223372036854775807"),
        ({"reply_to": -3}, "reply_to must be a message id from 1"),
        ({"reply_to": 2**63}, "reply_to must be a message id from 1 to 9223372036854775807"),
        ({"reply_to": 10**5000}, "reply_to must be a message id"),
        ({"content": "caf\udce9"}, "content contains a lone surrogate (U+DCE9) at position 3"),
        ({"content": "a\x00b"}, "content contains a NUL character (U+0000) at position 1"),
        ({"images": ["https://example.test/\x00.png"]}, "images[0] contains a NUL character"),
        ({"images": ["https://example.test/\ud800.png"]}, "images[0] contains a lone surrogate"),
        ({"images": ["data:image/png\x00;base64,AAAA"]}, "images[0] contains a NUL character"),
    ],
)
def test_invalid_messages_raise_one_clear_line(fields: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidTurn) as info:
        parse(**fields)
    assert fragment in info.value.message
    assert "\n" not in info.value.message


def test_base64_image_data_is_checked_to_its_end() -> None:
    settings = load_settings({"CHATQ_MAX_IMAGE_BYTES": "100000"})
    good = base64.b64encode(bytes(range(256)) * 100).decode()
    body = {"turn_id": TURN, "session_id": SESSION, "content": "hi"}
    parse_turn_request({**body, "images": ["data:image/png;base64," + good]}, task_id=TURN, settings=settings)
    for bad in (good[:8000] + "!" + good[8001:], good + "@@", good[:-1]):
        with pytest.raises(InvalidTurn, match=r"images\[0\] is not valid base64"):
            parse_turn_request({**body, "images": ["data:image/png;base64," + bad]}, task_id=TURN, settings=settings)


def test_a_message_without_turn_id_uses_the_task_id() -> None:
    # celery-node's `applyAsync([], {session_id, content})`: the task id is the turn id by contract.
    request = parse_turn_request({"session_id": SESSION, "content": "hi"}, task_id=TURN, settings=SETTINGS)
    assert str(request.turn_id) == TURN
    with pytest.raises(InvalidTurn, match=r"the task id .* is not a valid UUID"):
        parse_turn_request({"session_id": SESSION, "content": "hi"}, task_id="not-a-uuid", settings=SETTINGS)
    with pytest.raises(InvalidTurn, match="missing field"):
        parse_turn_request({"session_id": SESSION, "content": "hi"}, settings=SETTINGS)


@pytest.mark.parametrize("kwargs", [["a"], "text", 5, None])
def test_keyword_arguments_that_are_not_an_object_are_refused(kwargs: object) -> None:
    with pytest.raises(InvalidTurn, match="keyword arguments must be an object, got"):
        parse_turn_request(kwargs, task_id=TURN, settings=SETTINGS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: validate_model("gpt\x00"), "model contains a NUL character"),
        (lambda: validate_model("gpt\udc80"), "model contains a lone surrogate (U+DC80)"),
        (lambda: validate_model(7), "model must be a string"),
        (lambda: validate_system_prompt("be\ud83d brief", SETTINGS), "system_prompt contains a lone surrogate"),
        (lambda: validate_metadata({"a": "\x00"}), "metadata has a NUL character (U+0000) at position 0"),
        (lambda: validate_metadata({"a": [1, {"b\ud800": 1}]}), "metadata has a lone surrogate (U+D800)"),
        (lambda: validate_metadata({"a": float("nan")}), "metadata has nan at a, which JSON cannot hold"),
        (lambda: validate_metadata({1: "x"}), "keys must be strings"),
        (lambda: validate_metadata({"a": object()}), "not a JSON value"),
        (lambda: validate_metadata("x"), "metadata must be an object"),
    ],
)
def test_session_fields_postgres_cannot_store_are_refused_naming_the_field(call: object, fragment: str) -> None:
    with pytest.raises(InvalidTurn) as info:
        call()  # type: ignore[operator]
    assert fragment in info.value.message


def test_deeply_nested_metadata_is_refused_without_recursion() -> None:
    deep: object = "leaf"
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(InvalidTurn, match="nested deeper than 32 levels"):
        validate_metadata(deep)
    assert validate_metadata({"user": {"id": 7, "tags": ["x", None, True, 1.5]}}) == {
        "user": {"id": 7, "tags": ["x", None, True, 1.5]}
    }


def test_redacted_kwargs_never_show_user_content() -> None:
    shown = redacted_kwargs({"turn_id": TURN, "session_id": SESSION, "content": "my secret plan", "images": ["x"]})
    assert "secret" not in shown and "<14 chars>" in shown and TURN in shown

from __future__ import annotations

import base64
import uuid

import pytest

from worker.config import load_settings
from worker.errors import InvalidTurn
from worker.payload import parse_turn_request, redacted_kwargs

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
        ({"reply_to": True}, "reply_to must be a positive message id"),
        ({"reply_to": -3}, "reply_to must be a positive message id"),
    ],
)
def test_invalid_messages_raise_one_clear_line(fields: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidTurn) as info:
        parse(**fields)
    assert fragment in info.value.message
    assert "\n" not in info.value.message


def test_redacted_kwargs_never_show_user_content() -> None:
    shown = redacted_kwargs({"turn_id": TURN, "session_id": SESSION, "content": "my secret plan", "images": ["x"]})
    assert "secret" not in shown and "<14 chars>" in shown and TURN in shown


def test_the_producer_knows_every_registered_framework() -> None:
    from handlers import framework_names
    from worker.producer import FRAMEWORKS

    assert sorted(FRAMEWORKS) == sorted(framework_names())

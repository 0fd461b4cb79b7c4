"""What Postgres can store: the cleaning of model output and the telling of outages from refused data."""

from __future__ import annotations

import psycopg
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import DataError, IntegrityError, OperationalError, ProgrammingError

from worker.storable import clean_json, clean_text, is_outage, is_refusal, refusal_message, unstorable_char


def test_clean_text_replaces_only_what_postgres_cannot_store() -> None:
    text = "plain ascii"
    assert clean_text(text) is text
    assert clean_text("héllo ✓ 😀") == "héllo ✓ 😀"
    assert clean_text("a\x00b") == "a\ufffdb"
    assert clean_text("x\ud800y") == "x\ufffdy"
    # The two halves of one character, joined in Python from two chunks, are that character.
    assert clean_text("\ud83d" + "\ude00") == "😀"
    assert clean_json({"args": {"q\x00": ["a\ud800", 1, None]}}) == {"args": {"q\ufffd": ["a\ufffd", 1, None]}}


def test_unstorable_char_names_the_character_and_where_it_is() -> None:
    assert unstorable_char("fine ✓") is None
    assert unstorable_char("ab\x00") == "a NUL character (U+0000) at position 2"
    assert unstorable_char("é\udcff") == "a lone surrogate (U+DCFF) at position 1"


def _wrapped(kind: type[Exception], orig: Exception) -> Exception:
    return kind("INSERT ...", {}, orig)  # type: ignore[call-arg]


def test_only_connection_level_errors_are_outages() -> None:
    assert is_outage(_wrapped(OperationalError, psycopg.OperationalError("server closed the connection")))
    assert is_outage(RedisConnectionError("Connection refused"))
    assert is_outage(ConnectionResetError())
    for refused in (
        _wrapped(DataError, psycopg.errors.NumericValueOutOfRange("bigint out of range")),
        _wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key")),
        _wrapped(ProgrammingError, psycopg.errors.UntranslatableCharacter("unsupported Unicode escape")),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ):
        assert not is_outage(refused) and is_refusal(refused), refused
    assert not is_refusal(ValueError("a bug, not data"))


def test_a_refusal_is_one_line_without_the_data() -> None:
    orig = psycopg.errors.InvalidTextRepresentation(
        'invalid input syntax for type json\nDETAIL:  Token "NaN" is invalid.\nCONTEXT:  JSON data, line 1: [{"secret'
    )
    message = refusal_message(_wrapped(DataError, orig), "the reply")
    expected = "Postgres could not store the reply (InvalidTextRepresentation: invalid input syntax for type json)"
    assert message == expected
    assert "secret" not in message

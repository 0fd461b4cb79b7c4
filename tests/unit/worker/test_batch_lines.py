"""Batch lines that are not JSON: the error names the column where the JSON goes wrong in that line."""

from __future__ import annotations

import pytest

from chatq.settings import Settings
from worker.cli.batch import parse_batch


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # The object never closes: the parser gives up just past the line's last character.
        ('{"id": "a", "turns": ["x"]\n', "not valid JSON (Expecting ',' delimiter at column 27)"),
        ('{"id": "a", "turns": ["x"]\r\n', "not valid JSON (Expecting ',' delimiter at column 27)"),
        ('   {"id": 3,\n', "not valid JSON (Expecting property name enclosed in double quotes at column 13)"),
        ('{"id": "a", "turns": ["x]}\n', "not valid JSON (Unterminated string starting at column 23)"),
        ("not json\n", "not valid JSON (Expecting value at column 1)"),
        ('{"id": "a"} {"id": "b"}\n', "not valid JSON (Extra data at column 13)"),
    ],
)
def test_json_errors_name_the_column_in_the_line(line: str, message: str) -> None:
    conversations, errors = parse_batch(['{"id": "ok", "turns": ["hi"]}\n', line], Settings())
    assert [c.id for c in conversations] == ["ok"]
    assert [str(error) for error in errors] == [f"line 2: {message}"]

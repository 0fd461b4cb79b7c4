"""Text every part of chatq can carry: no U+0000 (Postgres text and JSONB refuse it) and no lone
surrogate (U+D800 to U+DFFF without its pair: not UTF-8, so neither psycopg nor an HTTP client
can encode it).

What a model returns is cleaned with these as soon as it arrives (`handlers.chat_models.turn`),
so a reply never fails over an invisible character: not when it is stored, and not when its tool
calls go back to the model in the next request. `worker.storable` applies them again before a
reply is stored, for every framework.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REPLACEMENT", "UNSTORABLE", "clean_json", "clean_text"]

REPLACEMENT = "\ufffd"
"""What cleaned text has in place of a character that cannot be carried."""

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""A NUL or a surrogate (a pair is two matches; `clean_text` joins pairs again)."""


def clean_text(text: str) -> str:
    """`text` with every NUL and lone surrogate replaced by U+FFFD (surrogate pairs joined)."""
    if text.isascii() and "\x00" not in text:
        return text
    if UNSTORABLE.search(text) is None:
        return text
    text = text.replace("\x00", REPLACEMENT)
    # Two halves of one character (a model's JSON split between chunks) become the character again.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_json(value: Any) -> Any:
    """JSON-like data with `clean_text` applied to every string, keys included."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_json(key) if isinstance(key, str) else key: clean_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(item) for item in value]
    return value

"""Offline token counting: a fast, deterministic estimate of BPE token counts.

chatq needs token counts to fit history into a budget (`CHATQ_HISTORY_TOKENS`), on every turn and
for every framework, without a network and whatever the model. Real tokenizers are model-specific,
need vocabulary downloads (tiktoken fetches its files on first use) and cost more than the whole
history query, so chatq estimates instead and never loads a tokenizer.

How the estimate works: one compiled regex splits text the way GPT-style BPE pre-tokenizers do and
`len(findall())` counts the pieces, so the loop runs in C:

- a run of letters, with the space or underscore before it, is one token per up to 7 letters
  (common English words are one token; long or rare words and identifiers split into several);
- digits group by up to 3 (cl100k/o200k split numbers that way);
- CJK ideographs, kana and hangul count one token per character;
- punctuation groups by up to 2 characters (`()`, `==`, `",` are often single tokens);
- whitespace runs count one token per 8 characters (indentation is mostly merged).

Accuracy trade-off: for English prose and source code the estimate is typically within about 15%
of cl100k/o200k counts and tends to err high on long rare words, which is the safe side for a
budget. It is not exact: a history cut by this estimate may be a few percent shorter or longer
than the real limit, so the budget should leave headroom below the model's context window.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MESSAGE_OVERHEAD_TOKENS", "count_message_tokens", "count_tokens"]

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens each chat message costs beyond its text (role and separators), as OpenAI documents (~3-4)."""

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# Order matters: at a space the word/number/punctuation branches take it as their prefix first.
_TOKEN_RE = re.compile(
    rf"[{_CJK}]"  # one token per CJK character
    rf"|[ _]?[^\W\d_{_CJK}]{{1,7}}"  # letters, up to 7 per token (`_name` merges like BPE)
    r"| ?\d{1,3}"  # numbers in groups of 3
    r"| ?(?:[^\w\s]|_){1,2}"  # punctuation (and underscores) in pairs
    r"|\s{1,8}"  # whitespace runs
)


def count_tokens(text: str) -> int:
    """Estimated number of BPE tokens in `text` (0 for the empty string)."""
    if not text:
        return 0
    return len(_TOKEN_RE.findall(text))


def count_message_tokens(message: Mapping[str, Any]) -> int:
    """Estimated tokens one chat message costs a model: content, tool calls, tool call id, overhead."""
    total = MESSAGE_OVERHEAD_TOKENS
    content = message.get("content")
    if isinstance(content, str):
        total += count_tokens(content)
    elif content:
        # Multi-part content (text and image parts): count its JSON, a fair upper estimate.
        total += count_tokens(json.dumps(content, ensure_ascii=False, separators=(",", ":")))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        total += count_tokens(json.dumps(tool_calls, ensure_ascii=False, separators=(",", ":")))
    tool_call_id = message.get("tool_call_id")
    if tool_call_id:
        total += count_tokens(str(tool_call_id))
    return total

"""`echo`: chatq's offline model, one for every adapter.

It answers the last user message's text (images are ignored) word by word, with token counts
estimated offline like a provider's usage report, so every path (graph, tool loop, streaming,
persistence, events) runs without a network or a key. The LangChain adapters see it as a chat
model (`handlers.chat_models.echo.EchoChatModel`), `plain_openai` answers it in place of a
request; both wrap `echo` here, so the same conversation gets the same reply and usage whatever
the framework. No agent framework is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from handlers.messages import Usage, content_text
from handlers.tokens import MESSAGE_OVERHEAD_TOKENS, count_tokens

__all__ = ["EMPTY_ECHO", "EchoReply", "echo"]

EMPTY_ECHO = "(empty message)"
"""What echo answers to a message without text, so its reply is never empty."""

# A word with the whitespace after it: joining the chunks gives back the text exactly.
_WORD = re.compile(r"\s*\S+\s*|\s+")


@dataclass(frozen=True, kw_only=True)
class EchoReply:
    """What echo answers to one conversation."""

    text: str
    """The reply: the last user message's text, or `EMPTY_ECHO`."""
    chunks: tuple[str, ...]
    """`text` as it streams, a word with the whitespace after it per chunk (joined: `text`)."""
    usage: Usage
    """Offline token estimate: `prompt_tokens` over every message sent, `completion_tokens` of the reply."""


def echo(messages: Iterable[tuple[str, object]]) -> EchoReply:
    """Echo's answer to `messages`: (role, content) of each message sent, oldest first.

    The role of the user's messages is `"user"`; content is a string, OpenAI content parts
    (`[{"type": "text", "text": ...}, ...]`) or None.
    """
    texts = [(role, content_text(content)) for role, content in messages]
    last_user = next((text for role, text in reversed(texts) if role == "user"), "")
    reply = last_user or EMPTY_ECHO
    prompt = sum(count_tokens(text) + MESSAGE_OVERHEAD_TOKENS for _, text in texts)
    completion = count_tokens(reply)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return EchoReply(text=reply, chunks=tuple(_WORD.findall(reply)), usage=usage)

"""Errors of the models package. Each docstring is the error's default, user-visible message.

The root derives from `chatq.errors.ChatqError`, so the command line and the gateway report these
errors like any other chatq error: one line, no traceback.
"""

from __future__ import annotations

from chatq.errors import ChatqError

__all__ = [
    "DocumentError",
    "KnowledgeBaseError",
    "KnowledgeBaseExists",
    "KnowledgeBaseNotFound",
    "ModelsError",
    "NotAUserMessage",
]


class ModelsError(ChatqError):
    """The stored data does not allow this."""


class KnowledgeBaseError(ModelsError):
    """The knowledge base operation failed."""


class KnowledgeBaseNotFound(KnowledgeBaseError):
    """No such knowledge base."""


class KnowledgeBaseExists(KnowledgeBaseError):
    """A knowledge base of that name already exists."""


class DocumentError(KnowledgeBaseError):
    """The document cannot be added."""


class NotAUserMessage(ModelsError):
    """reply_to is not a user message of this session."""

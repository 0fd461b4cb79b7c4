"""chatq's Postgres models, engine/session factory and migrations."""

from models.db import (
    autocommit_scope,
    connection_scope,
    dispose_engine,
    get_engine,
    get_sessionmaker,
    session_scope,
)
from models.errors import DocumentError, KnowledgeBaseError, KnowledgeBaseExists, KnowledgeBaseNotFound, ModelsError
from models.tables import (
    ACTIVE_STATUSES,
    MESSAGE_POSITION_STRIDE,
    Base,
    ChatMessage,
    ChatSession,
    Turn,
    TurnStatus,
)

__all__ = [
    "ACTIVE_STATUSES",
    "MESSAGE_POSITION_STRIDE",
    "Base",
    "ChatMessage",
    "ChatSession",
    "DocumentError",
    "KnowledgeBaseError",
    "KnowledgeBaseExists",
    "KnowledgeBaseNotFound",
    "ModelsError",
    "Turn",
    "TurnStatus",
    "autocommit_scope",
    "connection_scope",
    "dispose_engine",
    "get_engine",
    "get_sessionmaker",
    "session_scope",
]

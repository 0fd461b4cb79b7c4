"""The root of every chatq error. Each docstring is the error's default, user-visible message.

Every package's own errors (`worker.errors`, `models.errors`, `handlers.errors`) derive from
`ChatqError`, so the command line and the gateway report any of them the same way: one line, no
traceback.
"""

from __future__ import annotations

__all__ = ["ChatqError", "ConfigError", "InvalidTenant", "SessionNotFound", "TurnNotFound"]


class ChatqError(Exception):
    """chatq failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        """The one-line, user-visible text of this error."""
        return str(self.args[0]) if self.args else (self.__doc__ or "").strip()


class ConfigError(ChatqError):
    """The configuration in the environment is invalid."""


class InvalidTenant(ChatqError):
    """The tenant name is invalid: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit."""


class SessionNotFound(ChatqError):
    """No such session."""


class TurnNotFound(ChatqError):
    """No such turn."""

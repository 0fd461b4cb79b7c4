"""Errors of the worker package. Each docstring is the error's default, user-visible message."""

from __future__ import annotations


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


class InvalidTurn(ChatqError):
    """The turn is invalid and was not run."""


class SessionNotFound(ChatqError):
    """No such session."""


class TurnNotFound(ChatqError):
    """No such turn."""


class SessionBusy(ChatqError):
    """The session is busy with another turn."""


class TurnConflict(ChatqError):
    """A turn with this id already exists with different content."""


class NotCancellable(ChatqError):
    """The turn has already finished and cannot be cancelled."""


class ServiceUnavailable(ChatqError):
    """A service chatq needs (Postgres or Redis) is not reachable."""

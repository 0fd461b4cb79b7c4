"""The turn store of a claimed turn: chatq's Postgres store, with the history rows the claim read.

The claim statement reads the session's newest history rows with the turn (`Claim.history_head`,
`worker.store.transition_sql.HISTORY_HEAD` of them): the first page `handlers.history.trim_history`
asks for, and for most turns the only one. Pages within those rows come from the claim; anything
further (an older page, what lies before the kept history) is read as before, on a connection
opened when first needed. Nothing is stale: the rows are those of turns older than the claimed one,
which have all ended and do not change while it runs (`models.history.session_history`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager

from models.history import EarlierHistory, HistoryRow, SessionHistory
from models.turn_store import PostgresTurnStore
from worker.store.claims import Claim
from worker.store.transition_sql import HISTORY_HEAD

__all__ = ["ClaimedTurnStore"]

_Opener = Callable[[], AbstractContextManager[SessionHistory]]


class ClaimedTurnStore(PostgresTurnStore):
    """`PostgresTurnStore` whose history starts from the claim's rows (`Claim.history_head`)."""

    def __init__(self, claim: Claim) -> None:
        self._claim = claim

    def history(self, session_id: uuid.UUID, reply_to: int | None) -> AbstractContextManager[SessionHistory]:
        head = self._claim.history_head
        if head is None or reply_to is not None or session_id != self._claim.session.id:
            return super().history(session_id, reply_to)
        return _headed(session_id, head, lambda: PostgresTurnStore.history(self, session_id, None))


@contextmanager
def _headed(session_id: uuid.UUID, head: Sequence[HistoryRow], open_rest: _Opener) -> Iterator[SessionHistory]:
    """The history, its connection (if one was opened) closed when the block ends."""
    with ExitStack() as stack:
        yield _HeadedHistory(session_id, tuple(head), lambda: stack.enter_context(open_rest()))


class _HeadedHistory(SessionHistory):
    """`SessionHistory` answering from the claim's rows what they hold, the rest from Postgres."""

    def __init__(
        self, session_id: uuid.UUID, head: tuple[HistoryRow, ...], open_rest: Callable[[], SessionHistory]
    ) -> None:
        # No connection yet: `_rest` opens one on the first read the head cannot answer.
        self.session_id, self.before = session_id, None
        self._head = head
        self._open_rest = open_rest
        self._opened: SessionHistory | None = None

    def _rest(self) -> SessionHistory:
        if self._opened is None:
            self._opened = self._open_rest()
        return self._opened

    def page(self, cursor: int | None, limit: int) -> list[HistoryRow]:
        # The head is the newest HISTORY_HEAD rows; fewer means it is the whole history.
        if cursor is None and (limit <= len(self._head) or len(self._head) < HISTORY_HEAD):
            return list(self._head[:limit])
        return self._rest().page(cursor, limit)

    def earlier(self, boundary: int | None) -> EarlierHistory:
        return self._rest().earlier(boundary)

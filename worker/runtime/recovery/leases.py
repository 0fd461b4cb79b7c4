"""Leases on running turns, renewed for the whole process by one background thread.

A worker that dies (kill -9, lost host) stops renewing; once `CHATQ_LEASE_SECONDS` pass, the
sweeper hands its turns to another worker. The same renewal query reports cancellation requests
and lost leases, so a running turn learns of either within one renewal interval (about a second)
at the cost of one query per second per worker process, however many turns it runs.

Either one, and the worker beginning to shut down, also aborts the turn's `AbortSignal`
(`handlers.abort`): the model request it waits on is closed at once, so a model that sends
nothing for minutes does not keep a cancelled turn (or a shutting-down worker) waiting.

A keeper renews on the engine and with the lease length it was built with (the worker's runtime
hands them in, `get_lease_keeper`); it reads no settings and fetches no connection of its own.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine, func, update

from chatq.masking import mask_secrets
from chatq.per_process import PerProcess
from chatq.settings import Settings
from handlers.abort import AbortSignal
from models.db import session_scope
from models.tables import Turn, TurnStatus

log = logging.getLogger(__name__)


@dataclass(kw_only=True, eq=False)
class TurnLease:
    """A running turn's lease as seen by the thread that runs it."""

    turn_id: uuid.UUID
    """The turn."""
    token: uuid.UUID
    """The claim's lease token."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when `chatq cancel` asked this turn to stop."""
    lost: threading.Event = field(default_factory=threading.Event)
    """Set when the lease was taken over: this attempt must stop and write nothing."""
    abort: AbortSignal = field(default_factory=AbortSignal)
    """Aborted with either flag above, or at shutdown: closes the model request the turn waits on."""


class LeaseKeeper:
    """Renews the leases of all turns running in this process."""

    def __init__(self, *, engine: Engine, lease_seconds: float, interval: float) -> None:
        """Renew on `engine`, to `lease_seconds` from now, every `interval` seconds."""
        self.engine = engine
        self.lease_seconds = lease_seconds
        self.interval = interval
        self._leases: dict[uuid.UUID, TurnLease] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, turn_id: uuid.UUID, token: uuid.UUID) -> TurnLease:
        """Start renewing a claimed turn's lease."""
        lease = TurnLease(turn_id=turn_id, token=token)
        with self._lock:
            self._leases[token] = lease
            self._ensure_thread()
        return lease

    def unregister(self, lease: TurnLease) -> None:
        """Stop renewing (the turn finished or was handed back)."""
        with self._lock:
            self._leases.pop(lease.token, None)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="chatq-leases", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            with self._lock:
                leases = dict(self._leases)
            if not leases:
                continue
            try:
                self.renew(leases)
            except Exception as exc:  # keep renewing through database restarts
                log.warning("lease renewal failed (will retry): %s", mask_secrets(str(exc)).splitlines()[0])

    def renew(self, leases: dict[uuid.UUID, TurnLease]) -> None:
        """Extend every lease we hold; flag cancelled turns and leases we no longer hold."""
        with session_scope(self.engine) as db:
            rows = db.execute(
                update(Turn)
                .where(Turn.lease_token.in_(list(leases)), Turn.status == TurnStatus.RUNNING)
                .values(lease_expires_at=func.now() + timedelta(seconds=self.lease_seconds))
                .returning(Turn.lease_token, Turn.cancel_requested)
            ).all()
        held = {row.lease_token: row.cancel_requested for row in rows}
        for token, lease in leases.items():
            if token not in held:
                lease.lost.set()
                lease.abort.abort("the lease was lost")
            elif held[token]:
                lease.cancelled.set()
                lease.abort.abort("cancelled")

    def abort_all(self, reason: str) -> None:
        """Abort every running turn's model request (the worker is shutting down)."""
        with self._lock:
            leases = list(self._leases.values())
        for lease in leases:
            lease.abort.abort(reason)


class _Keepers:
    """A process's lease keepers, one per engine and lease length (a worker has one)."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Engine, float, float], LeaseKeeper] = {}
        self.lock = threading.Lock()


_keepers: PerProcess[_Keepers] = PerProcess(_Keepers)


def get_lease_keeper(settings: Settings, engine: Engine) -> LeaseKeeper:
    """This process's lease keeper for `engine` and the lease length of `settings` (a fresh one
    after fork: the renewal thread stays in the parent). A runtime rebuilt on the same values gets
    the same keeper, so a process keeps one renewal thread."""
    key = (engine, settings.lease_seconds, settings.renewal_interval)
    keepers = _keepers.get()
    with keepers.lock:
        keeper = keepers.by_key.get(key)
        if keeper is None:
            keeper = keepers.by_key[key] = LeaseKeeper(
                engine=engine, lease_seconds=settings.lease_seconds, interval=settings.renewal_interval
            )
        return keeper


_hand_back = threading.Event()


def begin_hand_back() -> None:
    """The worker is shutting down: running turns stop now, even mid-request, and go back to the queue."""
    _hand_back.set()
    keepers = _keepers.built()  # none built in this process: no turn is running here
    if keepers is not None:
        with keepers.lock:
            built = list(keepers.by_key.values())
        for keeper in built:
            keeper.abort_all("the worker is shutting down")


def handing_back() -> bool:
    """Whether running turns should be handed back (the worker is shutting down)."""
    return _hand_back.is_set()

"""Stream events (docs/contract.md, "Stream events"): Redis pub/sub per session plus a replay stream per turn.

Each event costs one round trip: PUBLISH, XADD and EXPIRE go in one write (`chatq.shortcuts.redis_resp`);
a terminal event goes through a script that lets only a turn's first one out (`worker.event_scripts`).
Publishing is best effort by design: Postgres holds the truth, so a Redis hiccup is logged and the
turn goes on rather than failing a reply the model already produced (the sweep publishes a terminal
event that did not get out, `worker.runtime.recovery.terminal_repair`).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from chatq.masking import mask_secrets
from chatq.per_process import PerProcess
from chatq.settings import get_settings
from chatq.shortcuts.redis_resp import Arg, roundtrip
from worker.event_scripts import (
    NUMBER_AND_PUBLISH_SHA,
    PUBLISH_TERMINAL_SHA,
    UNENDED,
    run_script,
    split_at_seq,
    terminal_arguments,
)

log = logging.getLogger(__name__)

EVENT_VERSION = 1


class EventType(enum.StrEnum):
    """The `type` of a stream event."""

    QUEUED = "queued"
    STARTED = "started"
    TEXT = "text"
    TOOL = "tool"
    RETRY = "retry"
    APPROVAL_REQUIRED = "approval_required"
    FINAL = "final"
    ERROR = "error"
    CANCELLED = "cancelled"


TERMINAL_TYPES = frozenset({EventType.FINAL, EventType.ERROR, EventType.CANCELLED})


def session_channel(session_id: object) -> str:
    """The pub/sub channel of a session's events."""
    return f"chatq:session:{session_id}"


def turn_stream(turn_id: object) -> str:
    """The replay stream of a turn's events."""
    return f"chatq:events:{turn_id}"


def make_redis(url: str) -> redis.Redis:
    """A Redis client with chatq's policy: short timeouts and a brief retry.

    redis-py's default retry backs off for seconds; a publisher stalled that long per event would
    turn a Redis blip into a stalled turn, so reconnect quickly and give up soon instead.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2,
        socket_timeout=5,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
        retry_on_timeout=True,
    )


_redis: PerProcess[redis.Redis] = PerProcess(lambda: make_redis(get_settings().redis_url), close=redis.Redis.close)


def get_redis() -> redis.Redis:
    """The process's Redis client for `REDIS_URL` (one connection pool per process)."""
    return _redis.get()


def reset_redis() -> None:
    """Drop the cached client (tests that switch Redis databases)."""
    _redis.reset()


def last_seq(client: redis.Redis, turn_id: object) -> int:
    """The `seq` of the newest event of a turn in its replay stream, 0 if none.

    A turn that moves to another worker (retry, takeover) continues its numbering from here.
    """
    try:
        entries = client.xrevrange(turn_stream(turn_id), count=1)
    except redis.RedisError as exc:
        log.warning("turn %s: could not read the last event seq: %s", turn_id, mask_secrets(str(exc)))
        return 0
    if not entries:
        return 0
    try:
        fields: Any = entries[0][1]
        return int(json.loads(fields[b"event"])["seq"])
    except (KeyError, ValueError, TypeError, IndexError):
        return 0


def encode_event(event: Mapping[str, Any]) -> str:
    """An event's JSON, as it is published and stored."""
    return json.dumps(event, separators=(",", ":"), default=str)


class TurnEvents:
    """Publishes one turn's events with consecutive `seq` numbers."""

    def __init__(
        self,
        *,
        session_id: object,
        turn_id: object,
        client: redis.Redis,
        retention: int,
        start_seq: int = 0,
    ) -> None:
        self.session_id = str(session_id)
        self.turn_id = str(turn_id)
        self.client = client
        """The Redis client to publish on (the runtime's, or the producer's)."""
        self.seq = start_seq
        self.retention = retention
        """Seconds a turn's replay stream is kept after its last event (`Settings.event_retention`)."""
        self._channel = session_channel(self.session_id)
        self._down_until = 0.0
        self._expiry_set = False
        self._seq_lock = threading.Lock()
        self._stream = turn_stream(self.turn_id)

    @classmethod
    def resume(cls, *, session_id: object, turn_id: object, client: redis.Redis, retention: int) -> TurnEvents:
        """A publisher that continues the numbering of events already in the turn's stream."""
        start = last_seq(client, turn_id)
        return cls(session_id=session_id, turn_id=turn_id, client=client, retention=retention, start_seq=start)

    @classmethod
    def resume_with(
        cls,
        type_: EventType,
        attempt: int,
        *,
        session_id: object,
        turn_id: object,
        client: redis.Redis,
        retention: int,
        **fields: Any,
    ) -> TurnEvents:
        """`resume()`, then `publish(type_, attempt, **fields)`, in one round trip.

        A script in Redis numbers the event after the newest one in the turn's stream (a `started`
        event also puts the turn in the unended set, `worker.event_scripts`). Where the script
        cannot run, the two steps run one after the other, with their own logging. Where Redis
        cannot be reached, the event is dropped as `send` drops events in an outage, and numbering
        starts from 0 as `last_seq` does then, without trying the two steps as well. A terminal
        event always takes the two steps (`send` publishes it only if it is the turn's first).
        """
        if type_ in TERMINAL_TYPES:
            events = cls.resume(session_id=session_id, turn_id=turn_id, client=client, retention=retention)
            events.publish(type_, attempt, **fields)
            return events
        events = cls(session_id=session_id, turn_id=turn_id, client=client, retention=retention)
        event = events.build(type_, attempt, **fields)
        # The JSON as every other event has it, split where the script writes the seq's value.
        head, tail = split_at_seq(encode_event(event), event["seq"])
        unended: tuple[Arg, Arg] = (events.turn_id, f"{time.time():.3f}") if type_ is EventType.STARTED else ("", 0)
        arguments = (2, events._stream, UNENDED, events._channel, events.retention, head, tail, *unended)
        try:
            replies = run_script(events.client, NUMBER_AND_PUBLISH_SHA, [arguments])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            events._went_down(1, exc)
            return events
        except redis.RedisError as exc:
            log.debug("turn %s: numbering script failed (%s); resuming in two steps", turn_id, mask_secrets(str(exc)))
            events = cls.resume(session_id=session_id, turn_id=turn_id, client=client, retention=retention)
            events.publish(type_, attempt, **fields)
            return events
        events.seq = int(replies[0])
        events._expiry_set = True
        return events

    def build(self, type_: EventType, attempt: int, **fields: Any) -> dict[str, Any]:
        """The next event as a dict, consuming one `seq`."""
        with self._seq_lock:
            self.seq += 1
            seq = self.seq
        event: dict[str, Any] = {
            "v": EVENT_VERSION,
            "type": type_.value,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "attempt": attempt,
            "seq": seq,
            "ts": round(time.time(), 3),
        }
        event.update(fields)
        return event

    def publish(self, type_: EventType, attempt: int, **fields: Any) -> dict[str, Any]:
        """Publish one event; never raises for Redis trouble (logged instead)."""
        event = self.build(type_, attempt, **fields)
        self.send([event])
        return event

    def send(self, events: Iterable[Mapping[str, Any]]) -> bool:
        """Publish already built events in one round trip (the client retries briefly).

        After a failure, non-terminal events are dropped for a second without trying, so a Redis
        outage costs a turn one short stall, not one per chunk; terminal events always try. A
        terminal event is published only if the turn has none yet (`worker.event_scripts`); a
        `started` event puts the turn in the unended set until it has.
        """
        batch = list(events)
        if not batch:
            return True
        terminal = any(event.get("type") in TERMINAL_TYPES for event in batch)
        if not terminal and time.monotonic() < self._down_until:
            return False
        commands: list[tuple[Arg, ...]] = []
        ends: list[tuple[Arg, ...]] = []
        for event in batch:
            payload = encode_event(event)
            if event.get("type") in TERMINAL_TYPES:
                ends.append(
                    terminal_arguments(
                        stream=self._stream,
                        channel=self._channel,
                        turn_id=self.turn_id,
                        retention=self.retention,
                        payload=payload,
                        seq=int(event["seq"]),
                    )
                )
                continue
            commands.append(("PUBLISH", self._channel, payload))
            commands.append(("XADD", self._stream, "*", "event", payload))
            if event.get("type") == EventType.STARTED:
                commands.append(("ZADD", UNENDED, "NX", f"{time.time():.3f}", self.turn_id))
        # The retention clock is set with the first event (a turn whose worker dies still
        # expires) and restarted by the terminal one (its script); events in between need not touch it.
        if not terminal and not self._expiry_set:
            commands.append(("EXPIRE", self._stream, self.retention))
        try:
            if ends:
                published = run_script(self.client, PUBLISH_TERMINAL_SHA, ends, before=commands)
            else:
                roundtrip(self.client, commands)
        except redis.RedisError as exc:
            self._went_down(len(batch), exc)
            return False
        self._down_until = 0.0
        self._expiry_set = True
        if ends and not all(published):
            log.info(
                "turn %s session %s: its terminal event was out already; not published again",
                self.turn_id,
                self.session_id,
            )
        return True

    def _went_down(self, count: int, exc: redis.RedisError) -> None:
        """Log events lost to Redis and hold non-terminal ones back for a second (see `send`)."""
        self._down_until = time.monotonic() + 1.0
        log.warning(
            "turn %s session %s: could not publish %d event(s): %s",
            self.turn_id,
            self.session_id,
            count,
            mask_secrets(str(exc)),
        )


class TextCoalescer:
    """Merges text chunks that arrive within a short window into one `text` event.

    The first chunk of a turn is never delayed (time to first token matters most); after that,
    chunks are held at most `window` seconds, also when the model pauses: a process-wide flusher
    thread publishes held text once its window has passed. A window of 0 sends every chunk as it
    comes (the default).
    """

    def __init__(self, events: TurnEvents, attempt: int, window: float) -> None:
        self.events = events
        self.attempt = attempt
        self.window = window
        self._buffer: list[str] = []
        self._deadline = 0.0
        self._sent_any = False
        self._lock = threading.Lock()
        self.messages_sent = 0

    def add(self, text: str) -> None:
        """Take the next chunk; publish now or hold it for the window."""
        if not text:
            return
        with self._lock:
            if self.window <= 0 or not self._sent_any:
                self._sent_any = True
                self._emit(text)
                return
            if not self._buffer:
                self._deadline = time.monotonic() + self.window
                _flusher().watch(self)
            self._buffer.append(text)
            if time.monotonic() >= self._deadline:
                self._flush_locked()

    def flush(self) -> None:
        """Publish what is held (call before any non-text event and at the end)."""
        with self._lock:
            self._flush_locked()

    def due_at(self) -> float:
        """When the held text must be published (monotonic clock)."""
        return self._deadline

    def flush_if_due(self, now: float) -> bool:
        """Publish held text whose window has passed; True once nothing is held."""
        with self._lock:
            if self._buffer and now >= self._deadline:
                self._flush_locked()
            return not self._buffer

    def _flush_locked(self) -> None:
        if self._buffer:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._emit(text)

    def _emit(self, text: str) -> None:
        self.messages_sent += 1
        self.events.publish(EventType.TEXT, self.attempt, text=text)


class _Flusher:
    """One thread per process that publishes coalesced text when its window expires."""

    def __init__(self) -> None:
        self._pending: set[TextCoalescer] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chatq-text-flusher", daemon=True)
        self._thread.start()

    def watch(self, coalescer: TextCoalescer) -> None:
        with self._lock:
            self._pending.add(coalescer)
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                self._wake.wait()
                self._wake.clear()
                continue
            # Sleep until the earliest window ends; a newly watched coalescer wakes us early.
            wait = min(c.due_at() for c in pending) - time.monotonic()
            if wait > 0 and self._wake.wait(wait):
                self._wake.clear()
                continue
            now = time.monotonic()
            done = [c for c in pending if c.flush_if_due(now)]
            with self._lock:
                self._pending.difference_update(done)


_flushers: PerProcess[_Flusher] = PerProcess(_Flusher)


def _flusher() -> _Flusher:
    return _flushers.get()

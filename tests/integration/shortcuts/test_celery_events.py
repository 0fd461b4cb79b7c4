"""chatq/shortcuts/celery_events.py against the real Redis: buffered task events survive a flush that
other threads append to while it publishes (Celery 5.5/5.6 dropped them; celery/celery#10434)."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.events.dispatcher import EventDispatcher
from kombu import Connection, Producer

from chatq.shortcuts import celery_events
from chatq.shortcuts.celery_events import FlushSafeEventDispatcher

pytestmark = pytest.mark.usefixtures("chatq_env")


class _Events:
    """The task events of this test's own uuids published on the run's Redis db (a worker of another
    test may publish there too), read from Celery's fanout topic."""

    def __init__(self, redis_url: str) -> None:
        self._pubsub = redis.Redis.from_url(redis_url).pubsub()
        self._pubsub.psubscribe("*celeryev*")
        self._pubsub.get_message(timeout=5)  # the psubscribe confirmation: listening from here on
        self.uuids: list[str] = []

    def collect(self, ours: set[str], expected: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.uuids) < expected and time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=0.5)
            if message and message["type"] == "pmessage":
                envelope = json.loads(message["data"])
                body = envelope["body"]
                if envelope.get("properties", {}).get("body_encoding") == "base64":
                    body = base64.b64decode(body)
                events = json.loads(body)
                for event in events if isinstance(events, list) else [events]:
                    if event.get("uuid") in ours:
                        self.uuids.append(event["uuid"])
        return self.uuids

    def close(self) -> None:
        self._pubsub.close()


@pytest.fixture
def events(redis_url: str) -> Iterator[_Events]:
    listener = _Events(redis_url)
    yield listener
    listener.close()


def _dispatcher(cls: type[EventDispatcher], connection: Connection, producer: Producer | None = None) -> Any:
    from worker.app import app

    dispatcher = app.events.Dispatcher(connection, hostname="test@events", buffer_group=["task"])
    if cls is not type(dispatcher):
        dispatcher.__class__ = cls
    if producer is not None:
        dispatcher.producer = producer
    return dispatcher


def test_the_fix_is_taken_on_the_installed_celery_and_by_the_app() -> None:
    from worker.app import app

    assert celery_events.GATE.usable()
    assert issubclass(app.events.Dispatcher, FlushSafeEventDispatcher)


@pytest.mark.parametrize("cls", [FlushSafeEventDispatcher, EventDispatcher], ids=["chatq", "celery 5.6"])
def test_an_event_appended_during_the_publish_is_kept_for_the_next_flush(
    cls: type[EventDispatcher], redis_url: str, events: _Events
) -> None:
    late = str(uuid.uuid4())

    class AppendingProducer(Producer):  # type: ignore[misc]
        """A real producer; right after its first write a 'pool thread' appends an event."""

        appended = False

        def publish(self, *args: Any, **kwargs: Any) -> Any:
            sent = super().publish(*args, **kwargs)
            if not AppendingProducer.appended:
                AppendingProducer.appended = True
                dispatcher.send("task-succeeded", uuid=late)
            return sent

    with Connection(redis_url) as connection:
        dispatcher = _dispatcher(cls, connection, AppendingProducer(connection.default_channel))
        first = str(uuid.uuid4())
        dispatcher.send("task-started", uuid=first)
        dispatcher.flush()
        dispatcher.flush()
        seen = events.collect({first, late}, 2, timeout=3)
    if cls is FlushSafeEventDispatcher:
        assert seen == [first, late]
    else:  # Celery 5.6's own flush: the event appended during the write is gone
        assert seen == [first]


def test_threads_sending_while_the_consumer_flushes_lose_no_event(redis_url: str, events: _Events) -> None:
    threads, per_thread = 4, 300
    with Connection(redis_url) as connection:
        dispatcher = _dispatcher(FlushSafeEventDispatcher, connection)
        done = threading.Event()

        def pool_thread(n: int) -> None:
            for i in range(per_thread):
                dispatcher.send("task-succeeded", uuid=f"{n}-{i}")

        senders = [threading.Thread(target=pool_thread, args=(n,)) for n in range(threads)]
        for sender in senders:
            sender.start()

        def consumer() -> None:
            while not done.is_set():
                dispatcher.flush()

        flusher = threading.Thread(target=consumer)
        flusher.start()
        for sender in senders:
            sender.join()
        done.set()
        flusher.join()
        dispatcher.flush()
        sent = {f"{n}-{i}" for n in range(threads) for i in range(per_thread)}
        seen = events.collect(sent, len(sent))
    assert sorted(seen) == sorted(sent)

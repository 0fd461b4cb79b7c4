"""The Celery settings that the product's safety depends on."""

from __future__ import annotations

import pickle

import pytest
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads

from worker.app import app


def test_json_only_and_pickle_refused() -> None:
    conf = app.conf
    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json" and conf.result_serializer == "json"
    body = pickle.dumps({"turn_id": "x"})
    with pytest.raises(ContentDisallowed):
        loads(body, "application/x-python-serialize", "binary", accept=conf.accept_content)


def test_reliability_settings() -> None:
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_connection_retry_on_startup is True
    assert conf.task_ignore_result is True
    assert conf.worker_send_task_events is True
    assert conf.broker_transport_options["visibility_timeout"] > 120 * 2
    assert conf.broker_transport_options["queue_order_strategy"] == "priority"
    assert [q.name for q in conf.task_queues] == ["chatq", "chatq.batch"]

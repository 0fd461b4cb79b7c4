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
    assert [q.name for q in conf.task_queues] == ["chatq", "chatq.batch", "chatq.webhooks"]
    assert conf.task_routes["chatq.deliver_webhook"] == {"queue": "chatq.webhooks"}


def test_pool_threads_share_one_result_backend() -> None:
    """A backend built per pool thread costs an entry-point scan each; turns have no results to store."""
    import threading

    seen = []
    thread = threading.Thread(target=lambda: seen.append(app.backend))
    thread.start()
    thread.join()
    assert seen == [app.backend]
    assert type(app.backend).__name__ == "DisabledBackend"


def test_tls_urls_verify_the_server_unless_they_say_otherwise() -> None:
    import ssl

    from celeryconfig import broker_ssl_options

    assert broker_ssl_options("rediss://:secret@cache.example:6380/0") == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    assert broker_ssl_options("rediss://cache:6380/0?ssl_cert_reqs=none") is None
    assert broker_ssl_options("redis://localhost:6379/0") is None


def test_a_rediss_url_with_a_password_configures_the_broker_and_is_masked(tmp_path: object) -> None:
    import subprocess
    import sys

    code = (
        "from worker.app import app; c = app.conf; import json;"
        "print(json.dumps([c.broker_url.startswith('rediss://'), bool(c.broker_use_ssl)]));"
        "from chatq.settings import get_settings; print(get_settings().redis_url_masked)"
    )
    env = {"REDIS_URL": "rediss://:hunter2@cache.example:6380/0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[true, true]", "rediss://:***@cache.example:6380/0"]

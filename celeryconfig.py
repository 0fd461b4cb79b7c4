"""Celery settings for chatq, read from the environment through `chatq.settings`.

Only settings that differ from Celery's defaults are here, each with the reason.
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlsplit

from kombu import Exchange, Queue

from chatq.settings import get_settings
from worker.runtime.intake.intake import max_item_bytes

_settings = get_settings()


def broker_ssl_options(url: str) -> dict[str, object] | None:
    """TLS options for a `rediss://` broker URL that does not carry them itself.

    Celery refuses a `rediss://` URL without `ssl_cert_reqs`; verifying the server certificate is
    the safe default, and a URL that says otherwise (`?ssl_cert_reqs=none`) is left to say so.
    """
    parts = urlsplit(url)
    if parts.scheme != "rediss" or "ssl_cert_reqs" in parse_qs(parts.query):
        return None
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED}


broker_url = _settings.redis_url
# kombu's Redis transport with each queue item checked before kombu parses it (worker/runtime/intake/broker.py), and one
# Redis client per channel instead of one per publish (chatq/shortcuts/kombu_channel.py).
broker_transport = "worker.runtime.intake.broker:Transport"
broker_use_ssl = broker_ssl_options(broker_url)
# Keep trying while Redis starts (compose, rolling restarts) instead of exiting at boot.
broker_connection_retry_on_startup = True
broker_connection_max_retries = None
broker_transport_options = {
    # A late-acked message is handed to another worker when this runs out, so it must outlast the
    # longest turn (all attempts); Postgres leases, not this, are what detect a dead worker quickly.
    "visibility_timeout": int(max(3600.0, _settings.turn_timeout * _settings.max_attempts * 4)),
    "socket_timeout": 30,
    "socket_connect_timeout": 10,
    "health_check_interval": 25,
    # Take from queues in the order the worker lists them (`chatq` before `chatq.batch`), so an
    # interactive turn never waits behind a batch, while idle batch capacity is still used.
    "queue_order_strategy": "priority",
    # The largest queue item chatq's transport lets through (worker/runtime/intake/broker.py):
    # what a turn within this process's limits can need.
    "chatq_item_limit": max_item_bytes(_settings),
}

# JSON only: a producer in any language can speak it, and pickle from the broker would be code execution.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"

# Turn state lives in Postgres; a result backend would be a second, weaker source of truth.
result_backend = None
task_ignore_result = True
# The disabled backend holds no state, so one instance serves every thread. Without this Celery
# builds a backend per pool thread, and each build scans every installed package's entry points
# (a few ms of CPU), which 200 fresh threads pay while turns are starting.
result_backend_thread_safe = True

# Ack after the turn ran, so a worker that dies mid-turn leaves the message to be delivered again;
# the Postgres claim makes the second delivery harmless.
task_acks_late = True
task_reject_on_worker_lost = True
# One message at a time per pool slot: turns are long, and prefetched ones would wait behind them.
worker_prefetch_multiplier = 1
# Finish the turns in hand when Redis blips; their replies go to Postgres, and duplicates are no-ops.
worker_cancel_long_running_tasks_on_connection_loss = False

# Interactive turns and batch conversations on separate queues so a big batch never delays a chat.
# Each queue has an exchange and routing key of its own: two queues sharing a binding would each
# get a copy of every message published to it (a retry of a message that named that exchange).
task_default_queue = "chatq"
task_default_exchange = "chatq"
task_default_routing_key = "chatq"
# Webhook deliveries have a queue of their own, listed last: they use a worker's idle capacity and
# never delay a turn (and each process sends at most CHATQ_WEBHOOK_CONCURRENCY at once).
task_queues = (
    Queue("chatq", Exchange("chatq", type="direct"), routing_key="chatq"),
    Queue("chatq.batch", Exchange("chatq.batch", type="direct"), routing_key="chatq.batch"),
    Queue("chatq.webhooks", Exchange("chatq.webhooks", type="direct"), routing_key="chatq.webhooks"),
)
task_routes = {
    "chatq.run_turn": {"queue": "chatq"},
    "chatq.sweep": {"queue": "chatq"},
    "chatq.deliver_webhook": {"queue": "chatq.webhooks"},
}

# Task events for Flower (and `celery events`): what workers do with each task (received, started,
# succeeded, failed, retried). Not the producer's `task-sent` event: it was 30 to 40% of the
# producer's send (bench/profile_turn.py: send_task 1.3-1.6 ms with it, 0.94 ms without), and a
# queued turn is already visible in Postgres (`chatq show`) and by its `queued` stream event.
# Flower lists a task from the moment a worker receives it.
worker_send_task_events = True
task_send_sent_event = False


# What chatq's own signal handlers need from the settings (worker/ops/signals.py: the log format,
# the metrics endpoint), handed to them in the app's configuration: this module is where a Celery
# process reads its settings.
chatq_log_format = _settings.log_format
chatq_metrics_port = _settings.metrics_port
chatq_metrics_addr = _settings.metrics_addr

# Plugins register tools or agent frameworks when the worker starts (CHATQ_PLUGINS).
imports = _settings.plugins

timezone = "UTC"
enable_utc = True

beat_schedule = {
    "chatq-sweep": {"task": "chatq.sweep", "schedule": _settings.sweep_interval, "options": {"expires": 60}},
}

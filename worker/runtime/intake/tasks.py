"""Celery tasks. Thin bodies: parse the message, call plain functions, declare the retry policy."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from celery import Task
from celery.exceptions import InvalidTaskError
from celery.signals import task_internal_error

from worker.app import app
from worker.dispatch import STORED_HEADER
from worker.errors import InvalidTurn, TurnFailed
from worker.payload import BATCH_QUEUE, INTERACTIVE_QUEUE, parse_turn_request, parse_uuid, redacted_kwargs
from worker.runtime.delivery.process import current_runtime
from worker.runtime.delivery.runner import Outcome, execute_turn, reject, retry_after_outage
from worker.storable import OUTAGE_ERRORS

# Postgres or Redis unreachable or restarting: the turn is not at fault, so retry without limit,
# backing off (`worker.runtime.policy.retry.RetryPolicy.after_outage`). Only connection-level errors: data Postgres
# refuses (DataError, IntegrityError, ...) never reaches here, the runner fails it at once (`worker.storable`).
INFRASTRUCTURE_ERRORS = OUTAGE_ERRORS


@app.task(
    name="chatq.run_turn",
    bind=True,
    # Our own signature checks give clear errors; Celery's would raise before the body runs.
    typing=False,
    acks_late=True,
    ignore_result=True,
    # Whether and when to retry is `worker.runtime.policy.retry.RetryPolicy`'s decision for every cause. The budget
    # of AgentInvocationError lives in Postgres (`attempts`, CHATQ_MAX_ATTEMPTS), which survives
    # redelivery; Celery's counter does not, so it is not the limit here.
    max_retries=None,
    # A failed turn ends its task in FAILURE (Flower's Failed view, alerts on task states), logged
    # as expected: one line, no traceback, and no Celery retry.
    throws=(TurnFailed,),
)
def run_turn(self: Task[Any, Any], *args: Any, **kwargs: Any) -> str:
    """Run one chat turn (docs/contract.md, "The task")."""
    # The queue the message was taken from (worker.runtime.intake.intake rewrites delivery_info to say so): every
    # re-send goes back there, whatever exchange the producer's envelope named.
    delivery = getattr(self.request, "delivery_info", None) or {}
    queue = delivery.get("routing_key") or INTERACTIVE_QUEUE
    if queue not in (INTERACTIVE_QUEUE, BATCH_QUEUE):
        queue = INTERACTIVE_QUEUE
    runtime = current_runtime()
    try:
        if args:
            raise InvalidTurn("chatq.run_turn takes keyword arguments only")
        request = parse_turn_request(kwargs, task_id=self.request.id, settings=runtime.settings)
    except InvalidTurn as exc:
        reject(*_ids(kwargs, self.request.id), exc.message, runtime=runtime)
        raise TurnFailed(f"rejected: {exc.message}") from None
    try:
        # A message without chatq's header (a raw producer's) is stored before it is claimed.
        stored = bool(getattr(self.request, STORED_HEADER, False))
        result = execute_turn(
            request, queue=queue, worker=self.request.hostname or "worker", runtime=runtime, stored=stored
        )
    except INFRASTRUCTURE_ERRORS as exc:
        decision = retry_after_outage(request, exc, self.request.retries, runtime=runtime)
        raise self.retry(exc=exc, countdown=decision.delay, queue=queue, **_hidden(kwargs)) from None
    if result.outcome in (Outcome.RETRY, Outcome.BUSY, Outcome.WAITING):
        # The runner asked the policy; its delay is on the result. A WAITING turn (the model service
        # or its shared limits said "not now") is re-sent with a countdown: no thread waits for it.
        countdown = result.retry_after if result.retry_after is not None else runtime.retry.agent_delay
        raise self.retry(countdown=countdown, queue=queue, **_hidden(kwargs))
    if result.outcome is Outcome.FAILED:
        raise TurnFailed(result.error)
    return result.outcome.value


def _hidden(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Retried messages keep showing ids and sizes only (Celery would repr the content otherwise)."""
    return {"kwargsrepr": redacted_kwargs(kwargs), "argsrepr": "()"}


def _ids(kwargs: dict[str, Any], task_id: str | None) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The turn and session ids of an invalid message, as far as they can be trusted."""
    # The task id is the turn id by contract; a body claiming another id is not trusted.
    try:
        turn_id = uuid.UUID(str(task_id))
    except ValueError:
        turn_id = uuid.UUID(int=0)
    try:
        session_id: uuid.UUID | None = uuid.UUID(str(kwargs.get("session_id")))
    except ValueError:
        session_id = None
    return turn_id, session_id


@app.task(
    name="chatq.deliver_webhook",
    bind=True,
    typing=False,
    # At least once: a worker that dies mid-attempt leaves the message to be delivered again.
    acks_late=True,
    ignore_result=True,
    # The retry window is the policy's (`RetryPolicy.after_webhook_attempt`, about an hour), counted
    # from the row's creation in Postgres; Celery's counter is not the limit.
    max_retries=None,
)
def deliver_webhook(self: Task[Any, Any], *args: Any, **kwargs: Any) -> str:
    """POST an ended turn to its webhook, one attempt per run (docs/contract.md, "Webhooks")."""
    from worker.runtime.webhooks.deliveries import WEBHOOK_QUEUE, DeliveryOutcome, deliver

    runtime = current_runtime()
    try:
        if args or set(kwargs) != {"delivery_id"}:
            raise InvalidTurn("chatq.deliver_webhook takes one keyword argument, delivery_id")
        delivery_id = parse_uuid(str(kwargs["delivery_id"]), "delivery_id")
    except InvalidTurn as exc:
        raise TurnFailed(f"rejected: {exc.message}") from None
    try:
        result = deliver(delivery_id, runtime=runtime)
    except INFRASTRUCTURE_ERRORS as exc:
        decision = runtime.retry.after_outage(self.request.retries)
        raise self.retry(exc=exc, countdown=decision.delay, queue=WEBHOOK_QUEUE) from None
    if result.outcome in (DeliveryOutcome.RETRY, DeliveryOutcome.BUSY):
        raise self.retry(countdown=result.retry_after, queue=WEBHOOK_QUEUE)
    return result.outcome.value


@app.task(name="chatq.sweep", ignore_result=True, acks_late=False)
def sweep() -> dict[str, int]:
    """Re-send lost turns and take over expired leases (run by `chatq beat`, under the workers' sweep lock)."""
    from worker.runtime.recovery.sweeper import sweep_exclusively

    report = sweep_exclusively(current_runtime())
    return report.as_dict() if report is not None else {"skipped": 1}


# Celery checks that the keyword arguments are a mapping before the task body runs, and reports a
# body that sends a list or a string only as a RuntimeWarning with a traceback. Say it in one line
# instead, as for every other invalid message (the message is acknowledged and nothing is stored).
warnings.filterwarnings(
    "ignore",
    message=r"Exception raised outside body: InvalidTaskError\('Task keyword arguments is not a mapping'\)",
    category=RuntimeWarning,
)


@task_internal_error.connect
def _reject_invalid_message(
    sender: Any = None, task_id: str | None = None, kwargs: Any = None, exception: Any = None, **_: Any
) -> None:
    if getattr(sender, "name", None) != "chatq.run_turn" or not isinstance(exception, InvalidTaskError):
        return
    if isinstance(kwargs, Mapping):
        reason = f"invalid task message: {exception}"
    else:
        reason = f"the task's keyword arguments must be an object, got {type(kwargs).__name__}"
    reject(*_ids({}, task_id), reason, runtime=current_runtime())

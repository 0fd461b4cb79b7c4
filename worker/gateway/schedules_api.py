"""The gateway's schedule endpoints: list, create, show (with the last runs), change, pause, resume, delete.

Each runs behind the route table's prologue (`worker/gateway/routing.py`). Every one is scoped by
the token's tenant as the session endpoints are: another tenant's schedule answers 404 exactly as
one that does not exist, and a schedule on a session needs a session the tenant owns.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from worker.gateway.routing import Call
from worker.gateway.state import threaded

__all__ = [
    "create_schedule",
    "delete_schedule",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "show_schedule",
    "update_schedule",
]

LAST_RUNS = 10
"""Runs `GET /schedules/{id}` lists."""


def _body(schedule: Any) -> dict[str, Any]:
    return {**schedule.as_dict(), "links": {"self": f"/schedules/{schedule.id}"}}


def _number(data: dict[str, Any], name: str) -> Any:
    value = data.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise HTTPException(422, f"{name} must be a number or null, got {type(value).__name__}")
    return value


async def list_schedules(call: Call) -> Response:
    """The tenant's schedules, newest first."""
    from worker.schedules import list_schedules as listing

    schedules = await threaded(listing, tenant=call.tenant)
    return JSONResponse({"schedules": [_body(s) for s in schedules]})


async def create_schedule(call: Call) -> Response:
    """Create a schedule (on a session of the tenant's, or from a session template)."""
    from worker.producer import create_schedule as create

    data = call.data
    if not isinstance(data.get("content"), str):
        raise HTTPException(422, "content (the user message of each run) is required and must be a string")
    schedule = await threaded(
        create,
        content=data["content"],
        session_id=data.get("session_id"),
        session_template=data.get("session_template"),
        cron=data.get("cron"),
        every=_number(data, "every"),
        timezone=data.get("timezone", "UTC"),
        overlap=data.get("overlap", "skip"),
        misfire=data.get("misfire", "once"),
        start_at=data.get("start_at"),
        end_at=data.get("end_at"),
        max_runs=data.get("max_runs"),
        enabled=data.get("enabled", True) is not False,
        name=data.get("name"),
        tenant=call.tenant,
    )
    return JSONResponse(_body(schedule), status_code=201, headers={"Location": f"/schedules/{schedule.id}"})


async def show_schedule(call: Call) -> Response:
    """A schedule with its next tick and its last runs (their status)."""
    from worker.schedules import get_schedule, schedule_runs

    schedule = await threaded(get_schedule, call.schedule_id, tenant=call.tenant)
    runs = await threaded(schedule_runs, call.schedule_id, tenant=call.tenant, limit=LAST_RUNS)
    last = [
        {
            "turn_id": str(r.turn_id),
            "session_id": str(r.session_id),
            "status": r.status,
            "created_at": r.created_at.isoformat(),
        }
        for r in runs
    ]
    return JSONResponse({**_body(schedule), "last_runs": last})


async def update_schedule(call: Call) -> Response:
    """Change what is given (content, timing, policies, bounds, name)."""
    from worker.producer import update_schedule as update
    from worker.sessions import KEEP

    data = call.data
    if not data:
        raise HTTPException(422, "nothing to change")
    changes = {name: data[name] for name in data}
    if "every" in changes:
        _number(data, "every")
    schedule = await threaded(
        update,
        call.schedule_id,
        content=changes.get("content", KEEP),
        cron=changes.get("cron", KEEP),
        every=changes.get("every", KEEP),
        timezone=changes.get("timezone", KEEP),
        overlap=changes.get("overlap", KEEP),
        misfire=changes.get("misfire", KEEP),
        end_at=changes.get("end_at", KEEP),
        max_runs=changes.get("max_runs", KEEP),
        name=changes.get("name", KEEP),
        tenant=call.tenant,
    )
    return JSONResponse(_body(schedule))


async def pause_schedule(call: Call) -> Response:
    """Stop firing it until resumed."""
    from worker.schedules import pause_schedule as pause

    return JSONResponse(_body(await threaded(pause, call.schedule_id, tenant=call.tenant)))


async def resume_schedule(call: Call) -> Response:
    """Fire it again from its next tick (none of the ticks missed while paused)."""
    from worker.schedules import resume_schedule as resume

    return JSONResponse(_body(await threaded(resume, call.schedule_id, tenant=call.tenant)))


async def delete_schedule(call: Call) -> Response:
    """Delete it; the turns it made stay."""
    from worker.schedules import delete_schedule as delete

    schedule_id = await threaded(delete, call.schedule_id, tenant=call.tenant)
    return JSONResponse({"schedule_id": str(schedule_id), "deleted": True})

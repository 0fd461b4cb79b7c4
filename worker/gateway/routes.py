"""The gateway's route table: every endpoint once, with what `GET /openapi.json` says of it.

`create_app` makes its routes from `ROUTES` (each behind the shared prologue of
`worker/gateway/routing.py`), and `openapi` builds the document's paths from the same rows. A new
endpoint is one row here; the tenant walk (tests/integration/tenants/test_tenant_walk.py) then
asks for a probe of it when its path names an object.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from worker.gateway import schedules_api, sessions_api, site, streams, turns_api
from worker.gateway.openapi import base_schema
from worker.gateway.routing import Call, Endpoint, json_content, openapi_paths

__all__ = ["ROUTES", "openapi"]


def _param(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/parameters/{name}"}


def _query_time(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"}}


_PAGE = (_param("Limit"), _param("Cursor"))
_EVENT_STREAM_PARAMS = (_param("LastEventIdHeader"), _param("LastEventIdQuery"), _param("AccessToken"))
_EVENT_STREAM = {"200": {"$ref": "#/components/responses/EventStream"}}


async def openapi(call: Call) -> Response:
    """The OpenAPI document: the shared parts (`worker/gateway/openapi.py`) and a path per row of `ROUTES`."""
    from handlers import framework_names

    schema = base_schema(framework_names(), default=sessions_api.DEFAULT_FRAMEWORK)
    schema["paths"] = openapi_paths(ROUTES)
    return JSONResponse(schema)


ROUTES: list[Endpoint] = [
    Endpoint(method="GET", path="/", handler=site.page, public=True),
    Endpoint(method="GET", path="/favicon.svg", handler=site.favicon, public=True),
    Endpoint(method="GET", path="/favicon.ico", handler=site.favicon, public=True),
    Endpoint(
        method="GET",
        path="/healthz",
        handler=site.healthz,
        public=True,
        summary="Liveness check",
        description=(
            "200 whenever the process answers, whatever the state of Postgres and Redis: restart the gateway "
            "when this fails, not when they do (that is `/readyz`)."
        ),
        responses={
            "200": {
                "description": "the gateway process answers",
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "properties": {"status": {"type": "string", "enum": ["ok"]}}}
                    }
                },
            }
        },
    ),
    Endpoint(
        method="GET",
        path="/readyz",
        handler=site.readyz,
        public=True,
        summary="Readiness check",
        description=(
            "Checks Postgres (`SELECT 1`) and Redis (`PING`) side by side, each bounded, so the answer never "
            "takes much over two seconds. Send traffic to the gateway only while this is 200."
        ),
        responses={
            "200": json_content("Postgres and Redis answer", "Readiness"),
            "503": json_content("Postgres or Redis (or both) does not answer; `error` names which", "Readiness"),
        },
    ),
    Endpoint(method="GET", path="/openapi.json", handler=openapi, public=True),
    Endpoint(
        method="POST",
        path="/sessions",
        handler=sessions_api.create_session,
        summary="Create a chat session",
        tags=("sessions",),
        body="NewSession",
        body_required=False,
        responses={"201": json_content("the new session", "Session")},
    ),
    Endpoint(
        method="GET",
        path="/sessions",
        handler=sessions_api.list_sessions,
        summary="List sessions",
        description=(
            "Newest first, in keyset pages: `next_cursor` (while more remain) is the `cursor` of the next, "
            "older page, and a page is the same however many sessions are created meanwhile. "
            "`metadata.KEY=VALUE` keeps sessions whose metadata has KEY set to the string VALUE "
            "(repeat for several keys). A tenant's token lists only its tenant's sessions."
        ),
        tags=("sessions",),
        parameters=(
            *_PAGE,
            _query_time("created_after"),
            _query_time("created_before"),
            {
                "name": "metadata.KEY",
                "in": "query",
                "required": False,
                "description": "only sessions whose metadata has KEY = this string (e.g. `metadata.user=u42`)",
                "schema": {"type": "string"},
            },
        ),
        responses={"200": json_content("a page of sessions", "SessionPage")},
        errors=(422,),
    ),
    Endpoint(
        method="GET",
        path="/sessions/{session_id}",
        handler=sessions_api.show_session,
        summary="Show a session",
        tags=("sessions",),
        responses={"200": json_content("the session as stored", "StoredSession")},
    ),
    Endpoint(
        method="PATCH",
        path="/sessions/{session_id}",
        handler=sessions_api.update_session,
        summary="Change a session",
        description=(
            "Only the fields given change. `system_prompt: null` removes the instructions, `model: null` makes "
            "turns run on the worker's default model, `metadata` replaces the metadata, and `knowledge_bases` "
            "(names) replaces the attached set, `webhook` (an http(s) URL, null: none) is where turns that "
            "end from now on are POSTed, and `approval` (none, paid, all or tool names) which tool calls wait "
            "for a person. Turns claimed from now on see the change; a running turn finishes as "
            "it started."
        ),
        tags=("sessions",),
        body="SessionChange",
        responses={"200": json_content("the session after the change", "StoredSession")},
    ),
    Endpoint(
        method="DELETE",
        path="/sessions/{session_id}",
        handler=sessions_api.delete_session,
        summary="Delete a session",
        description=(
            "Queued turns are cancelled and running ones stopped first; then the session, its turns, messages, "
            "tool-call records and event streams are removed. Usage totals without content (tokens and "
            "paid-tool costs per day, tenant and model) are kept for billing."
        ),
        tags=("sessions",),
        responses={"200": json_content("the session is gone", "DeletedSession")},
    ),
    Endpoint(
        method="POST",
        path="/sessions/{session_id}/turns",
        handler=turns_api.submit_turn,
        summary="Submit a turn",
        description=(
            "Stores the turn as queued with its user message, then sends it to the workers. 202 for a new "
            "turn; 200 when `turn_id` names a turn already submitted with the same content (idempotent). "
            "With Redis down the turn is still stored, so the answer is 202 with `sent: false` (not 503): "
            "the sweeper sends it once Redis answers again, and a client must not submit it a second time. "
            "With `run_at` or `delay` it is stored `delayed` (no position, nothing sent) and queued when due."
        ),
        tags=("turns",),
        body="NewTurn",
        responses={
            "202": json_content(
                "the turn is stored as queued (`sent` false if Redis did not take it yet)", "SubmittedTurn"
            ),
            "200": json_content("the same turn was already submitted", "SubmittedTurn"),
        },
        errors=(409,),
    ),
    Endpoint(
        method="GET",
        path="/sessions/{session_id}/turns",
        handler=sessions_api.list_session_turns,
        summary="List a session's turns",
        description=(
            "The newest `limit` turns, oldest first within the page, each with its messages (as "
            "`GET /turns/{id}` shows a turn). While older turns remain, `next_cursor` is the `cursor` of the "
            "page before this one; turns submitted meanwhile never shift a page."
        ),
        tags=("turns",),
        parameters=_PAGE,
        responses={"200": json_content("a page of turns", "TurnPage")},
        errors=(422,),
    ),
    Endpoint(
        method="GET",
        path="/sessions/{session_id}/events",
        handler=streams.stream_session,
        summary="Stream a session's events (SSE)",
        description=(
            "A new stream starts with the session's unfinished turns from their first event (so a page opened "
            "mid-reply sees the whole reply), then follows the session live; it never ends by itself. Each "
            "message's `id:` is a cursor `W:S[,P:S]...` (turn positions with the last `seq` delivered; turns "
            "before position W are complete). Reconnecting with it as `Last-Event-ID` resumes with nothing "
            "lost or repeated, as long as the turns' replay streams are kept (CHATQ_EVENT_RETENTION)."
        ),
        tags=("events",),
        query_token=True,
        parameters=_EVENT_STREAM_PARAMS,
        responses=_EVENT_STREAM,
        errors=(422,),
    ),
    Endpoint(
        method="GET",
        path="/turns/{turn_id}",
        handler=turns_api.show_turn,
        summary="Show a turn",
        tags=("turns",),
        responses={"200": json_content("the turn as stored in Postgres", "Turn")},
    ),
    Endpoint(
        method="POST",
        path="/turns/{turn_id}/cancel",
        handler=turns_api.cancel_turn,
        summary="Cancel a turn",
        description=(
            "A queued turn ends `cancelled` at once; a running one is asked to stop (status `running` here, "
            "then its `cancelled` event within about a second, even while the model sends nothing). A turn "
            "already cancelled, or already asked to stop, answers `already_cancelled: true` and changes nothing."
        ),
        tags=("turns",),
        responses={"200": json_content("cancelled, or asked to stop", "Cancelled")},
        errors=(409,),
    ),
    Endpoint(
        method="GET",
        path="/approvals",
        handler=turns_api.list_approvals,
        summary="List tool calls waiting for approval",
        description=(
            "Paused turns (`awaiting_approval`) with their waiting calls, nearest deadline first, as "
            "`pending_approvals()` and `chatq pending --json` list them. A tenant's token lists only its "
            "tenant's turns."
        ),
        tags=("approvals",),
        parameters=(
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "description": "most turns listed",
                "schema": {"type": "integer", "minimum": 1, "maximum": turns_api.MAX_APPROVALS, "default": 1000},
            },
        ),
        responses={"200": json_content("what waits for a decision", "PendingApprovals")},
        errors=(422,),
    ),
    Endpoint(
        method="POST",
        path="/turns/{turn_id}/approvals",
        handler=turns_api.decide_approvals,
        summary="Approve or deny waiting tool calls",
        description=(
            "Decides the waiting call `call_id` of a paused turn, or without it every call of the turn that "
            "waits (one transaction). Approve runs the call as the model made it, or with `args` (checked "
            "against the tool's parameter schema: 422 naming the argument); deny gives the model a tool "
            "result saying so and `reason`. After the round's last decision the turn is queued again and "
            "resumes from its journal (`resumed`). 409 for a call decided already or a turn not awaiting "
            "approval; 410 once the deadline passed (the call was denied as timed out)."
        ),
        tags=("approvals",),
        body="ApprovalDecision",
        responses={"200": json_content("the decision is recorded", "ApprovalDecided")},
        errors=(409, 410),
    ),
    Endpoint(
        method="GET",
        path="/turns/{turn_id}/events",
        handler=streams.stream_turn,
        summary="Stream a turn's events (SSE)",
        description=(
            "Each message has `id:` = the event's `seq` and `data:` = the event's JSON. With `Last-Event-ID: N` "
            "(EventSource sends it when it reconnects) the stream resumes after event N with nothing lost or "
            "repeated. The stream closes after the `final`, `error` or `cancelled` event; a reconnect after "
            "that gets 204 (which tells EventSource to stop). If the turn's replay stream has expired, its "
            'terminal event is rebuilt from Postgres (`"seq": null`, `"source": "postgres"`).'
        ),
        tags=("events",),
        query_token=True,
        parameters=_EVENT_STREAM_PARAMS,
        responses={**_EVENT_STREAM, "204": {"description": "the turn ended at or before Last-Event-ID"}},
        errors=(422,),
    ),
    Endpoint(
        method="GET",
        path="/schedules",
        handler=schedules_api.list_schedules,
        summary="List schedules",
        description="Newest first; a tenant's token lists only its tenant's schedules.",
        tags=("schedules",),
        responses={"200": json_content("the schedules", "ScheduleList")},
    ),
    Endpoint(
        method="POST",
        path="/schedules",
        handler=schedules_api.create_schedule,
        summary="Create a schedule",
        description=(
            "A turn submitted on a cron expression (in `timezone`) or `every` N seconds, fired by the "
            "workers: exactly one of `session_id` (each run a turn of that session) and `session_template` "
            '(each run a new session), exactly one of `cron` and `every`. docs/contract.md, "Schedules".'
        ),
        tags=("schedules",),
        body="NewSchedule",
        responses={"201": json_content("the new schedule", "Schedule")},
    ),
    Endpoint(
        method="GET",
        path="/schedules/{schedule_id}",
        handler=schedules_api.show_schedule,
        summary="Show a schedule",
        description="With `next_run_at` and `last_runs`: its latest turns and their status.",
        tags=("schedules",),
        responses={"200": json_content("the schedule", "Schedule")},
    ),
    Endpoint(
        method="PATCH",
        path="/schedules/{schedule_id}",
        handler=schedules_api.update_schedule,
        summary="Change a schedule",
        description="Only the fields given change; a new timing sets the next tick from now.",
        tags=("schedules",),
        body="ScheduleChange",
        responses={"200": json_content("the schedule after the change", "Schedule")},
    ),
    Endpoint(
        method="DELETE",
        path="/schedules/{schedule_id}",
        handler=schedules_api.delete_schedule,
        summary="Delete a schedule",
        description="The turns it made stay (their `schedule_id` becomes null).",
        tags=("schedules",),
        responses={"200": {"description": "the schedule is gone"}},
    ),
    Endpoint(
        method="POST",
        path="/schedules/{schedule_id}/pause",
        handler=schedules_api.pause_schedule,
        summary="Pause a schedule",
        tags=("schedules",),
        responses={"200": json_content("the paused schedule", "Schedule")},
    ),
    Endpoint(
        method="POST",
        path="/schedules/{schedule_id}/resume",
        handler=schedules_api.resume_schedule,
        summary="Resume a schedule",
        description="It fires again from its next tick after now; ticks missed while paused do not run.",
        tags=("schedules",),
        responses={"200": json_content("the resumed schedule", "Schedule")},
    ),
]
"""Every endpoint, in the order Starlette matches them (rows without a summary are not documented)."""

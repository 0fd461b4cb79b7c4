"""The OpenAPI components of the schedule endpoints (`worker/gateway/schedules_api.py`), merged into
`worker.gateway.openapi.BASE_SCHEMA` (docs/contract.md, "Schedules")."""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEDULE_PARAMETERS", "SCHEDULE_SCHEMAS"]

_TIME = {"type": ["string", "null"], "format": "date-time"}

_TIMING: dict[str, Any] = {
    "cron": {"type": ["string", "null"], "description": "five-field cron expression, read in `timezone`"},
    "every": {"type": ["number", "null"], "minimum": 1, "description": "seconds between ticks (instead of cron)"},
    "timezone": {"type": "string", "description": "IANA zone for `cron` (default UTC)"},
    "overlap": {
        "type": "string",
        "enum": ["skip", "enqueue"],
        "description": "a tick while the last run is unfinished",
    },
    "misfire": {
        "type": "string",
        "enum": ["skip", "once", "all"],
        "description": "ticks missed by more than CHATQ_SCHEDULE_MISFIRE_GRACE: none, one or each (at most 100) runs",
    },
    "end_at": _TIME,
    "max_runs": {"type": ["integer", "null"], "minimum": 1},
    "name": {"type": ["string", "null"]},
    "content": {"type": "string", "description": "the user message of each run"},
}

SCHEDULE_PARAMETERS: dict[str, Any] = {
    "ScheduleId": {
        "name": "schedule_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    },
}
"""The path parameter of `/schedules/{schedule_id}`."""

SCHEDULE_SCHEMAS: dict[str, Any] = {
    "NewSchedule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["content"],
        "properties": {
            **_TIMING,
            "session_id": {"type": ["string", "null"], "format": "uuid", "description": "each run a turn of it"},
            "session_template": {
                "type": ["object", "null"],
                "description": "each run a new session: framework, model, system_prompt, metadata",
            },
            "start_at": _TIME,
            "enabled": {"type": "boolean"},
        },
    },
    "ScheduleChange": {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": _TIMING},
    "Schedule": {
        "type": "object",
        "properties": {
            **_TIMING,
            "id": {"type": "string", "format": "uuid"},
            "tenant": {"type": ["string", "null"]},
            "session_id": {"type": ["string", "null"], "format": "uuid"},
            "session_template": {"type": ["object", "null"]},
            "start_at": _TIME,
            "enabled": {"type": "boolean", "description": "false while paused or once done"},
            "next_run_at": _TIME,
            "runs": {"type": "integer"},
            "skipped": {"type": "integer"},
            "last_run_at": _TIME,
            "created_at": {"type": "string", "format": "date-time"},
            "last_runs": {
                "type": "array",
                "description": "the latest runs (GET /schedules/{id} only): turn_id, session_id, status, created_at",
                "items": {"type": "object"},
            },
        },
    },
    "ScheduleList": {
        "type": "object",
        "properties": {"schedules": {"type": "array", "items": {"$ref": "#/components/schemas/Schedule"}}},
    },
}
"""Request and response bodies of the schedule endpoints."""

"""The parts of the OpenAPI document shared by every endpoint; the paths come from the route table.

Each row of `worker/gateway/routes.py` becomes one operation (`worker/gateway/routing.py`), which
refers to the parameters, responses and schemas here; a request body's schema here is also the
list of fields the endpoint accepts.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from worker.gateway.schedule_schemas import SCHEDULE_PARAMETERS, SCHEDULE_SCHEMAS

EVENT_EXAMPLE = (
    'id: 7\ndata: {"v":1,"type":"text","session_id":"...","turn_id":"...","attempt":1,"seq":7,'
    '"ts":1764450000.123,"text":"next chunk"}\n\n'
)

BASE_SCHEMA: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "chatq gateway",
        "version": "1",
        "description": (
            "The chatq producer API over HTTP and its stream events as Server-Sent Events. "
            "Every request except `GET /`, `GET /healthz`, `GET /readyz` and `GET /openapi.json` needs "
            "`Authorization: Bearer <CHATQ_API_TOKEN>`; the two event streams also accept "
            "`?access_token=` because a browser's EventSource cannot send headers. A scoped token "
            "(`CHATQ_API_TOKENS`, one tenant's) sees only the sessions it created, their turns and "
            "streams: another tenant's answer 404, exactly as ids that do not exist. "
            'Errors are JSON objects `{"error": "one clear line"}`.'
        ),
    },
    "security": [{"bearer": []}],
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "CHATQ_API_TOKEN"},
            "accessToken": {
                "type": "apiKey",
                "in": "query",
                "name": "access_token",
                "description": "The same token as a query parameter; accepted on the GET event streams only.",
            },
        },
        "parameters": {
            "SessionId": {
                "name": "session_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "format": "uuid"},
            },
            **SCHEDULE_PARAMETERS,
            "TurnId": {
                "name": "turn_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "format": "uuid"},
            },
            "LastEventIdHeader": {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "Resume after this event (EventSource sends it when it reconnects).",
                "schema": {"type": "string"},
            },
            "LastEventIdQuery": {
                "name": "last_event_id",
                "in": "query",
                "required": False,
                "description": "Same as the Last-Event-ID header, for clients that cannot set it; the header wins.",
                "schema": {"type": "string"},
            },
            "Limit": {
                "name": "limit",
                "in": "query",
                "required": False,
                "description": "rows per page",
                "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            },
            "Cursor": {
                "name": "cursor",
                "in": "query",
                "required": False,
                "description": "the `next_cursor` of the previous page (opaque)",
                "schema": {"type": "string"},
            },
            "AccessToken": {
                "name": "access_token",
                "in": "query",
                "required": False,
                "description": "The bearer token, for EventSource (which cannot send headers).",
                "schema": {"type": "string"},
            },
        },
        "responses": {
            "Error401": {
                "description": "missing or wrong bearer token",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error404": {
                "description": "no such session or turn",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error409": {
                "description": "conflict (busy session with if_busy=reject, turn id reused, turn already "
                "finished, a call decided already or a turn not awaiting approval)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error410": {
                "description": "gone: the approval deadline passed and the call was denied as timed out",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error413": {
                "description": "request body over CHATQ_API_MAX_BODY_BYTES",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error415": {
                "description": "the body is not sent as application/json",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error422": {
                "description": "invalid input; `error` says what is wrong in one line",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "Error503": {
                "description": "Postgres (or, for an event stream, Redis) is not reachable",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "EventStream": {
                "description": (
                    "Server-Sent Events. Each message's `data:` is one stream event (docs/contract.md, Stream events); "
                    "comment lines (`: keepalive`) come every CHATQ_SSE_HEARTBEAT seconds on an idle stream."
                ),
                "content": {"text/event-stream": {"schema": {"type": "string"}, "example": EVENT_EXAMPLE}},
            },
        },
        "schemas": {
            **SCHEDULE_SCHEMAS,
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string", "description": "one user-visible line"}},
            },
            "NewSession": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    # The enum and default are the framework registry's (`base_schema`).
                    "framework": {"type": "string"},
                    "model": {
                        "type": ["string", "null"],
                        "description": (
                            "absent or null: the session stores no model and each turn runs on the default "
                            "model of the worker that runs it (the worker's CHATQ_MODEL), not the gateway's"
                        ),
                    },
                    "system_prompt": {"type": ["string", "null"]},
                    "metadata": {"type": ["object", "null"]},
                    "webhook": {
                        "type": ["string", "null"],
                        "format": "uri",
                        "description": "http(s) URL each turn of the session is POSTed to when it ends "
                        "(signed; see the Webhook schema and docs/gateway.md)",
                    },
                    "approval": {
                        "oneOf": [
                            {"type": "string", "enum": ["none", "paid", "all"]},
                            {"type": "array", "items": {"type": "string"}},
                        ],
                        "description": "which tool calls wait for a person's approval (docs/contract.md, "
                        "'Approvals'); kept in the metadata as `approval`",
                    },
                },
            },
            "Session": {
                "type": "object",
                "required": ["session_id"],
                "properties": {
                    "session_id": {"type": "string", "format": "uuid"},
                    "links": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "StoredSession": {
                "type": "object",
                "description": "A session as stored (`chatq session show --json`).",
                "properties": {
                    "id": {"type": "string", "format": "uuid"},
                    "framework": {"type": "string"},
                    "model": {"type": ["string", "null"], "description": "null: the worker's default model"},
                    "system_prompt": {"type": ["string", "null"]},
                    "metadata": {"type": "object"},
                    "knowledge_bases": {"type": "array", "items": {"type": "string"}},
                    "webhook": {"type": ["string", "null"], "description": "where its turns are POSTed when they end"},
                    "tenant": {"type": ["string", "null"], "description": "the scoped token's tenant that created it"},
                    "turns": {"type": "integer", "description": "turns submitted so far"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "last_active_at": {"type": "string", "format": "date-time"},
                    "links": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "SessionPage": {
                "type": "object",
                "required": ["sessions", "next_cursor"],
                "properties": {
                    "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/StoredSession"}},
                    "next_cursor": {"type": ["string", "null"], "description": "null on the last page"},
                },
            },
            "SessionChange": {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "properties": {
                    "system_prompt": {"type": ["string", "null"], "description": "null removes it"},
                    "model": {"type": ["string", "null"], "description": "null: the worker's default model"},
                    "metadata": {"type": ["object", "null"], "description": "replaces the metadata"},
                    "knowledge_bases": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "replaces the attached knowledge bases (names of the session's tenant's)",
                    },
                    "webhook": {"type": ["string", "null"], "description": "an http(s) URL; null removes it"},
                    "approval": {
                        "oneOf": [
                            {"type": "string", "enum": ["none", "paid", "all"]},
                            {"type": "array", "items": {"type": "string"}},
                        ],
                        "description": "which tool calls wait for a person's approval (docs/contract.md, "
                        "'Approvals'); kept in the metadata as `approval`",
                    },
                },
            },
            "DeletedSession": {
                "type": "object",
                "properties": {
                    "session_id": {"type": "string", "format": "uuid"},
                    "turns": {"type": "integer", "description": "turns deleted with it"},
                    "stopped": {
                        "type": "array",
                        "items": {"type": "string", "format": "uuid"},
                        "description": "unfinished turns stopped first",
                    },
                },
            },
            "TurnPage": {
                "type": "object",
                "required": ["turns", "next_cursor"],
                "properties": {
                    "turns": {"type": "array", "items": {"$ref": "#/components/schemas/Turn"}},
                    "next_cursor": {"type": ["string", "null"], "description": "the page of older turns; null if none"},
                },
            },
            "NewTurn": {
                "type": "object",
                "required": ["content"],
                "additionalProperties": False,
                "properties": {
                    "content": {
                        "type": "string",
                        "description": "the user's message (at most CHATQ_MAX_CONTENT_CHARS)",
                    },
                    "images": {
                        "type": ["array", "null"],
                        "items": {"type": "string", "description": "https://... or data:image/...;base64,..."},
                    },
                    "reply_to": {"type": ["integer", "null"], "description": "answer this earlier user message"},
                    "turn_id": {
                        "type": ["string", "null"],
                        "format": "uuid",
                        "description": "idempotency key: the same id with the same content returns the existing turn",
                    },
                    "if_busy": {
                        "type": "string",
                        "enum": ["enqueue", "reject", "interrupt"],
                        "default": "enqueue",
                        "description": "when the session has unfinished turns: queue behind them, refuse (409), "
                        "or cancel them",
                    },
                    "webhook": {
                        "type": ["string", "null"],
                        "format": "uri",
                        "description": "http(s) URL this turn is POSTed to when it ends, instead of the session's",
                    },
                    "run_at": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "ISO 8601 time with its offset: the turn is stored `delayed` and queued "
                        "then, at the end of its session's order (a time not ahead: now). Not with `delay`, "
                        "nor with if_busy other than enqueue",
                    },
                    "delay": {
                        "type": ["number", "null"],
                        "minimum": 0,
                        "description": "seconds from now, as `run_at` (0: now)",
                    },
                },
            },
            "SubmittedTurn": {
                "type": "object",
                "required": ["turn_id", "session_id", "position", "created", "sent", "cancelled"],
                "properties": {
                    "turn_id": {"type": "string", "format": "uuid"},
                    "session_id": {"type": "string", "format": "uuid"},
                    "position": {"type": ["integer", "null"], "description": "null while the turn is delayed"},
                    "created": {"type": "boolean", "description": "false for an idempotent resubmission"},
                    "sent": {
                        "type": "boolean",
                        "description": "false if Redis was down (the sweeper sends it later) or the turn is delayed",
                    },
                    "cancelled": {"type": "array", "items": {"type": "string", "format": "uuid"}},
                    "run_at": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "a delayed turn's due time (null: queued at once)",
                    },
                    "links": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "Usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "completion_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
            "Message": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "role": {"type": "string", "enum": ["user", "assistant", "tool"]},
                    "content": {"type": "string"},
                    "tool_calls": {"type": ["array", "null"], "items": {"type": "object"}},
                    "tool_call_id": {"type": ["string", "null"]},
                    "images": {"type": ["array", "null"], "items": {"type": "string"}},
                    "position": {"type": "integer"},
                },
            },
            "Turn": {
                "type": "object",
                "description": "The turn as `chatq show --json` prints it.",
                "properties": {
                    "id": {"type": "string", "format": "uuid"},
                    "session_id": {"type": "string", "format": "uuid"},
                    "tenant": {"type": ["string", "null"], "description": "its session's tenant (null: none)"},
                    "position": {"type": ["integer", "null"], "description": "null while delayed"},
                    "status": {
                        "type": "string",
                        "enum": [
                            "delayed",
                            "queued",
                            "running",
                            "awaiting_approval",
                            "succeeded",
                            "failed",
                            "cancelled",
                        ],
                    },
                    "attempts": {"type": "integer"},
                    "error": {"type": ["string", "null"]},
                    "usage": {"$ref": "#/components/schemas/Usage"},
                    "created_at": {"type": ["string", "null"], "format": "date-time"},
                    "started_at": {"type": ["string", "null"], "format": "date-time"},
                    "finished_at": {"type": ["string", "null"], "format": "date-time"},
                    "run_at": {
                        "type": ["string", "null"],
                        "format": "date-time",
                        "description": "when a delayed turn is due",
                    },
                    "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
                    "pending_input": {
                        "type": ["object", "null"],
                        "description": "while delayed: its user message (`content`, `images`), stored when due",
                    },
                    "steps": {
                        "type": "array",
                        "description": "the turn's journal of finished steps (docs/contract.md, 'Durable steps')",
                        "items": {
                            "type": "object",
                            "properties": {
                                "seq": {"type": "integer"},
                                "kind": {
                                    "type": "string",
                                    "enum": [
                                        "model",
                                        "tool_started",
                                        "tool_result",
                                        "approval_pending",
                                        "approval_decided",
                                    ],
                                },
                                "attempt": {"type": "integer"},
                                "call_id": {"type": ["string", "null"]},
                                "tool_name": {"type": ["string", "null"]},
                            },
                        },
                    },
                    "webhook": {"oneOf": [{"$ref": "#/components/schemas/Webhook"}, {"type": "null"}]},
                },
            },
            "Webhook": {
                "type": "object",
                "description": "The turn's webhook (its own, else its session's) and the delivery of its "
                "end; the body POSTed is this Turn without `webhook`. A pause's deliveries are not shown.",
                "properties": {
                    "url": {"type": "string"},
                    "delivery_id": {
                        "type": ["string", "null"],
                        "format": "uuid",
                        "description": "X-Chatq-Delivery, the same on every attempt (null until the turn ends)",
                    },
                    "status": {"type": ["string", "null"], "enum": ["pending", "delivered", "failed", None]},
                    "attempts": {"type": "integer"},
                    "last_status_code": {"type": ["integer", "null"]},
                    "last_error": {"type": ["string", "null"]},
                    "last_attempt_at": {"type": ["string", "null"], "format": "date-time"},
                    "delivered_at": {"type": ["string", "null"], "format": "date-time"},
                },
            },
            "Readiness": {
                "type": "object",
                "required": ["status", "postgres", "redis"],
                "properties": {
                    "status": {"type": "string", "enum": ["ready", "not ready"]},
                    "postgres": {"type": "string", "description": '"ok", or why not (a timeout or an error kind)'},
                    "redis": {"type": "string", "description": '"ok", or why not (a timeout or an error kind)'},
                    "error": {"type": "string", "description": "with 503: which of them does not answer"},
                },
            },
            "PendingApprovals": {
                "type": "object",
                "required": ["approvals"],
                "properties": {
                    "approvals": {
                        "type": "array",
                        "description": "paused turns, nearest deadline first, as `pending_approvals()` lists them",
                        "items": {
                            "type": "object",
                            "properties": {
                                "turn_id": {"type": "string", "format": "uuid"},
                                "session_id": {"type": "string", "format": "uuid"},
                                "until": {"type": "number", "description": "the deadline, Unix time"},
                                "calls": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "id": {"type": "string"},
                                            "name": {"type": "string"},
                                            "args": {"type": "object"},
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
            "ApprovalDecision": {
                "type": "object",
                "required": ["approve"],
                "additionalProperties": False,
                "properties": {
                    "call_id": {
                        "type": ["string", "null"],
                        "description": "the waiting call; absent or null: every call of the turn that waits",
                    },
                    "approve": {"type": "boolean", "description": "true runs the call, false denies it"},
                    "args": {
                        "type": ["object", "null"],
                        "description": "approve with these arguments instead (checked against the tool's schema; "
                        "without call_id only while exactly one call waits)",
                    },
                    "reason": {"type": ["string", "null"], "description": "why; a denial's reason reaches the model"},
                },
            },
            "ApprovalDecided": {
                "type": "object",
                "properties": {
                    "turn_id": {"type": "string", "format": "uuid"},
                    "calls": {"type": "array", "items": {"type": "string"}, "description": "the calls decided"},
                    "approved": {"type": "boolean"},
                    "resumed": {
                        "type": "boolean",
                        "description": "true: nothing more waits; the turn is queued again and resumes",
                    },
                },
            },
            "Cancelled": {
                "type": "object",
                "properties": {
                    "turn_id": {"type": "string", "format": "uuid"},
                    "status": {"type": "string", "description": "cancelled, or running while the worker stops it"},
                    "already_cancelled": {
                        "type": "boolean",
                        "description": "true: the turn was already cancelled (or asked to stop); nothing changed",
                    },
                },
            },
        },
    },
}


def base_schema(frameworks: Sequence[str], *, default: str) -> dict[str, Any]:
    """`BASE_SCHEMA` with the registered frameworks (plugins' included) as the enum of `NewSession.framework`."""
    schema = copy.deepcopy(BASE_SCHEMA)
    framework = schema["components"]["schemas"]["NewSession"]["properties"]["framework"]
    framework["enum"] = list(frameworks)
    framework["default"] = default
    return schema

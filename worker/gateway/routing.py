"""The gateway's route table machinery: one prologue for every handler, the OpenAPI document from the table.

An `Endpoint` is one row of the route table (`worker/gateway/routes.py`): method, path, handler,
and what the OpenAPI document says of it. Every handler runs behind the same prologue
(`Endpoint.route`), in this order: the token authorized (the tenant; none for a public endpoint),
the path's ids parsed (404 for one that is not a UUID), the JSON body read (413, 415, 422) and its
fields checked against the request schema's properties (422 naming the unknown ones). The handler
gets the result as a `Call`. The document's operations are built from the same rows, so a route
and its documentation cannot drift apart: what the prologue may answer (401, 404, 413, 415, 422,
503) is added to each operation's responses from the row itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.gateway.openapi import BASE_SCHEMA
from worker.gateway.state import Gateway, check_fields, gateway_of, path_uuid

__all__ = ["Call", "Endpoint", "Handler", "body_fields", "json_content", "openapi_paths"]

PATH_IDS: dict[str, tuple[str, str]] = {
    "session_id": ("session", "SessionId"),
    "turn_id": ("turn", "TurnId"),
    "schedule_id": ("schedule", "ScheduleId"),
}
"""Path parameters that name an object: (what a bad one is called in the 404, its OpenAPI parameter)."""

_EVENT_STREAM_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"accessToken": []}]


@dataclass(frozen=True, kw_only=True)
class Call:
    """What the prologue found in one request, handed to the endpoint's handler."""

    request: Request
    """The request itself (query parameters, headers)."""
    gateway: Gateway
    """The app's shared state (settings, async Redis)."""
    tenant: str | None
    """The tenant the token is scoped to; None for an admin token, an unauthenticated gateway or a public endpoint."""
    ids: Mapping[str, uuid.UUID] = field(default_factory=dict)
    """The path's ids by parameter name (`session_id`, `turn_id`, `schedule_id`), parsed."""
    data: dict[str, Any] = field(default_factory=dict)
    """The JSON body (an object with only the request schema's fields); `{}` without a body."""

    @property
    def session_id(self) -> uuid.UUID:
        """The path's session id."""
        return self.ids["session_id"]

    @property
    def turn_id(self) -> uuid.UUID:
        """The path's turn id."""
        return self.ids["turn_id"]

    @property
    def schedule_id(self) -> uuid.UUID:
        """The path's schedule id."""
        return self.ids["schedule_id"]


Handler = Callable[[Call], Awaitable[Response]]
"""An endpoint's own work, after the prologue."""


def body_fields(schema: str) -> frozenset[str]:
    """The fields a request body of component schema `schema` may have (its properties)."""
    return frozenset(BASE_SCHEMA["components"]["schemas"][schema]["properties"])


def json_content(description: str, schema: str) -> dict[str, Any]:
    """An OpenAPI response whose body is the component schema `schema`."""
    return {"description": description, "content": {"application/json": {"schema": _ref("schemas", schema)}}}


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One row of the route table: a method and path, its handler, and its OpenAPI operation."""

    method: str
    """The HTTP method (GET also answers HEAD)."""
    path: str
    """The Starlette path; `{session_id}` and `{turn_id}` are parsed by the prologue."""
    handler: Handler
    """The endpoint's work, given the prologue's `Call`."""
    summary: str | None = None
    """The operation's summary; None leaves the endpoint out of the OpenAPI document."""
    description: str | None = None
    """The operation's longer description (Markdown)."""
    tags: tuple[str, ...] = ()
    """The document's groups the operation is listed under."""
    public: bool = False
    """No token needed (the page, the health checks, the document itself)."""
    query_token: bool = False
    """The token may come as `?access_token=` too (the event streams: EventSource sends no headers)."""
    body: str | None = None
    """The component schema of the JSON request body; its properties are the fields allowed."""
    body_required: bool = True
    """Whether the document marks the request body required."""
    parameters: tuple[dict[str, Any], ...] = ()
    """OpenAPI parameters after the path's ids (query parameters, headers)."""
    responses: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """The operation's own responses (its successes; a public endpoint's every answer)."""
    errors: tuple[int, ...] = ()
    """Error statuses of the handler's own (409, or 422 for query input) beyond what the prologue answers."""

    @property
    def path_ids(self) -> tuple[str, ...]:
        """The path parameters that name an object, in path order."""
        return tuple(name for name in PATH_IDS if "{" + name + "}" in self.path)

    @property
    def fields(self) -> frozenset[str]:
        """The request body's allowed fields (none without a body)."""
        return body_fields(self.body) if self.body is not None else frozenset()

    def route(self) -> Route:
        """The Starlette route: the shared prologue, then the handler."""
        handler, fields, names = self.handler, self.fields, self.path_ids

        async def endpoint(request: Request) -> Response:
            gateway = gateway_of(request)
            tenant = None if self.public else gateway.authorize(request, query_ok=self.query_token)
            ids = {name: path_uuid(request, name, PATH_IDS[name][0]) for name in names}
            data: dict[str, Any] = {}
            if self.body is not None:
                data = await gateway.read_json(request)
                check_fields(data, fields)
            return await handler(Call(request=request, gateway=gateway, tenant=tenant, ids=ids, data=data))

        endpoint.__name__ = getattr(handler, "__name__", "endpoint")
        return Route(self.path, endpoint, methods=[self.method], include_in_schema=False)

    def operation(self) -> dict[str, Any]:
        """The OpenAPI operation object of this endpoint."""
        operation: dict[str, Any] = {"summary": self.summary}
        if self.description is not None:
            operation["description"] = self.description
        if self.tags:
            operation["tags"] = list(self.tags)
        if self.public:
            operation["security"] = []
        elif self.query_token:
            operation["security"] = _EVENT_STREAM_SECURITY
        parameters = [_ref("parameters", PATH_IDS[name][1]) for name in self.path_ids] + list(self.parameters)
        if parameters:
            operation["parameters"] = parameters
        if self.body is not None:
            operation["requestBody"] = {
                "required": self.body_required,
                "content": {"application/json": {"schema": _ref("schemas", self.body)}},
            }
        responses = dict(self.responses)
        for status in sorted(self._error_statuses()):
            responses[str(status)] = _ref("responses", f"Error{status}")
        operation["responses"] = responses
        return operation

    def _error_statuses(self) -> set[int]:
        statuses = set(self.errors)
        if not self.public:
            statuses |= {401, 503}
        if self.path_ids:
            statuses.add(404)
        if self.body is not None:
            statuses |= {413, 415, 422}
        return statuses


def openapi_paths(endpoints: Sequence[Endpoint]) -> dict[str, dict[str, Any]]:
    """The document's `paths`: every endpoint with a summary, by path and lower-case method."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        if endpoint.summary is not None:
            paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = endpoint.operation()
    return paths

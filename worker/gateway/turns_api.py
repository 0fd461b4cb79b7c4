"""The gateway's turn endpoints: submit a turn to a session, show a turn, cancel one, decide on its
tool calls that wait for approval, and list what waits.

Each runs behind the route table's prologue (`worker/gateway/routing.py`), which authorized the
token, parsed the path's id and read the body. A scoped token reaches only its tenant's sessions
and turns; another tenant's answer 404, exactly as ids that do not exist.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from worker.gateway.routing import Call
from worker.gateway.state import optional_str, threaded

__all__ = ["cancel_turn", "decide_approvals", "list_approvals", "show_turn", "submit_turn"]

MAX_APPROVALS = 1000
"""Most paused turns one `GET /approvals` lists."""


async def submit_turn(call: Call) -> Response:
    """Submit a turn (a user message) to a session."""
    from worker.delays import parse_at
    from worker.producer import SubmittedTurn, get_session
    from worker.producer import submit_turn as submit

    data, session_id, tenant = call.data, call.session_id, call.tenant
    if "content" not in data:
        raise HTTPException(422, "content is required: the user's message as a string")
    content = data["content"]
    if not isinstance(content, str):
        raise HTTPException(422, f"content must be a string, got {type(content).__name__}")
    if_busy = data.get("if_busy") or "enqueue"
    if not isinstance(if_busy, str):
        raise HTTPException(422, f"if_busy must be a string, got {type(if_busy).__name__}")
    images, reply_to, turn_id = data.get("images"), data.get("reply_to"), optional_str(data, "turn_id")
    if images is not None and not isinstance(images, list):
        raise HTTPException(422, f"images must be a list of URLs or null, got {type(images).__name__}")
    webhook = optional_str(data, "webhook")
    run_at, delay = optional_str(data, "run_at"), data.get("delay")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float)):
        raise HTTPException(422, f"delay must be a number of seconds or null, got {type(delay).__name__}")
    due = None if run_at is None else parse_at(run_at)  # InvalidTurn: 422

    def run() -> SubmittedTurn:
        if tenant is not None:
            get_session(session_id, tenant=tenant)  # another tenant's session: 404, as if it did not exist
        return submit(
            session_id,
            content,
            images=images,
            reply_to=reply_to,
            turn_id=turn_id,
            if_busy=if_busy,
            webhook=webhook,
            run_at=due,
            delay=delay,
        )

    turn = await threaded(run)
    links = {"turn": f"/turns/{turn.turn_id}", "events": f"/turns/{turn.turn_id}/events"}
    body = {
        "turn_id": str(turn.turn_id),
        "session_id": str(turn.session_id),
        "position": turn.position,
        "created": turn.created,
        "sent": turn.sent,
        "cancelled": [str(other) for other in turn.cancelled],
        "run_at": turn.run_at.isoformat() if turn.run_at else None,
        "links": links,
    }
    return JSONResponse(body, status_code=202 if turn.created else 200, headers={"Location": links["turn"]})


async def show_turn(call: Call) -> Response:
    """A turn with its messages, as `chatq show --json` prints it."""
    from worker.queries import turn_report

    return JSONResponse(await threaded(turn_report, call.turn_id, tenant=call.tenant))


async def cancel_turn(call: Call) -> Response:
    """Cancel a queued or running turn."""
    from worker.producer import cancel_turn as cancel

    done = await threaded(cancel, call.turn_id, tenant=call.tenant)
    return JSONResponse({"turn_id": str(call.turn_id), "status": done.status.value, "already_cancelled": done.already})


async def list_approvals(call: Call) -> Response:
    """Paused turns of the caller's tenant and their waiting calls, nearest deadline first (`pending_approvals`)."""
    from worker.producer import pending_approvals

    params = call.request.query_params
    unknown = sorted(set(params) - {"limit"})
    if unknown:
        raise HTTPException(422, f"unknown query parameter {unknown[0][:60]!r}; use limit")
    raw = params.get("limit") or str(MAX_APPROVALS)
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_APPROVALS:
        raise HTTPException(422, f"limit must be a whole number from 1 to {MAX_APPROVALS}, got {raw[:20]!r}")
    waiting = await threaded(pending_approvals, tenant=call.tenant, limit=int(raw))
    return JSONResponse({"approvals": waiting})


async def decide_approvals(call: Call) -> Response:
    """Approve or deny one waiting tool call of a turn (`call_id`), or every one that waits."""
    from worker.producer import decide_tool_call, decide_turn

    data = call.data
    if "approve" not in data:
        raise HTTPException(422, "approve is required: true to run the call, false to deny it")
    call_id, reason = optional_str(data, "call_id"), optional_str(data, "reason")
    approve, args = data["approve"], data.get("args")
    if not isinstance(approve, bool):
        raise HTTPException(422, f"approve must be true or false, got {type(approve).__name__}")
    if args is not None and not isinstance(args, dict):
        raise HTTPException(422, f"args must be a JSON object or null, got {type(args).__name__}")
    calls: tuple[str, ...]
    if call_id is not None:
        one = await threaded(
            decide_tool_call, call.turn_id, call_id, approve=approve, args=args, reason=reason, tenant=call.tenant
        )
        calls, resumed = (one.call_id,), one.resumed
    else:
        every = await threaded(decide_turn, call.turn_id, approve=approve, args=args, reason=reason, tenant=call.tenant)
        calls, resumed = every.calls, every.resumed
    body = {"turn_id": str(call.turn_id), "calls": list(calls), "approved": approve, "resumed": resumed}
    return JSONResponse(body)

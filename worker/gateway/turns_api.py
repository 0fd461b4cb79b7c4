"""The gateway's turn endpoints: submit a turn to a session, show a turn, cancel one.

Each runs behind the route table's prologue (`worker/gateway/routing.py`), which authorized the
token, parsed the path's id and read the body. A scoped token reaches only its tenant's sessions
and turns; another tenant's answer 404, exactly as ids that do not exist.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from worker.gateway.routing import Call
from worker.gateway.state import optional_str, threaded

__all__ = ["cancel_turn", "show_turn", "submit_turn"]


async def submit_turn(call: Call) -> Response:
    """Submit a turn (a user message) to a session."""
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

    def run() -> SubmittedTurn:
        if tenant is not None:
            get_session(session_id, tenant=tenant)  # another tenant's session: 404, as if it did not exist
        return submit(
            session_id, content, images=images, reply_to=reply_to, turn_id=turn_id, if_busy=if_busy, webhook=webhook
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

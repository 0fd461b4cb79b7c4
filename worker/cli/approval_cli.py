"""`chatq pending`, `chatq approve`, `chatq deny`: tool calls that wait for a person (docs/contract.md "Approvals").

    chatq pending [--json]
    chatq approve TURN [CALL] [--args JSON]
    chatq deny TURN [CALL] --reason TEXT

Without CALL the decision applies to every call of TURN that waits (`--args` then needs exactly one).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from worker.errors import CliError

__all__ = ["approval_value", "register"]


def approval_value(text: str) -> str | list[str]:
    """`--approval`: none, paid, all, or tool names separated by commas."""
    return text if text in ("none", "paid", "all") else [name.strip() for name in text.split(",") if name.strip()]


def register(sub: Any) -> None:
    """Add the approval commands to `chatq`."""
    pending = sub.add_parser("pending", help="list the tool calls that wait for a person's approval")
    pending.add_argument("--json", action="store_true", help="print JSON")
    pending.set_defaults(func=cmd_pending)
    approve = sub.add_parser("approve", help="approve a waiting tool call (all of the turn's without CALL)")
    approve.add_argument("turn", metavar="TURN")
    approve.add_argument("call", metavar="CALL", nargs="?")
    approve.add_argument("--args", metavar="JSON", help="run the call with these arguments instead (a JSON object)")
    approve.set_defaults(func=cmd_approve)
    deny = sub.add_parser("deny", help="deny a waiting tool call (all of the turn's without CALL)")
    deny.add_argument("turn", metavar="TURN")
    deny.add_argument("call", metavar="CALL", nargs="?")
    deny.add_argument("--reason", required=True, help="why; the model reads it")
    deny.set_defaults(func=cmd_deny)


def cmd_pending(args: argparse.Namespace) -> int:
    from worker.producer import pending_approvals

    waiting = pending_approvals()
    if args.json:
        print(json.dumps(waiting, indent=2))
        return 0
    if not waiting:
        print("no tool call waits for approval")
    for turn in waiting:
        left = max(turn["until"] - time.time(), 0.0)
        for call in turn["calls"]:
            arguments = json.dumps(call["args"], ensure_ascii=False)
            print(f"{turn['turn_id']}  {call['id']}  {call['name']}  {arguments[:120]}  ({left:.0f} s left)")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    edited: Any = None
    if args.args is not None:
        try:
            edited = json.loads(args.args)
        except json.JSONDecodeError as exc:
            raise CliError(f"--args is not JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(edited, dict):
            raise CliError("--args must be a JSON object")
    return _decide(args.turn, args.call, approve=True, edited=edited)


def cmd_deny(args: argparse.Namespace) -> int:
    return _decide(args.turn, args.call, approve=False, reason=args.reason)


def _decide(turn: str, call: str | None, *, approve: bool, edited: Any = None, reason: str | None = None) -> int:
    from worker.producer import decide_tool_call, pending_approvals

    calls = [call] if call else [c["id"] for p in pending_approvals() if p["turn_id"] == turn for c in p["calls"]]
    if not calls:
        raise CliError(f"no tool call of turn {turn} waits for approval")
    if edited is not None and len(calls) > 1:
        raise CliError(f"turn {turn} has {len(calls)} waiting calls: name the CALL that --args is for")
    for call_id in calls:
        done = decide_tool_call(turn, call_id, approve=approve, args=edited, reason=reason)
        verb = "approved" if approve else "denied"
        print(f"call {call_id} of turn {turn} {verb}{'; the turn resumes' if done.resumed else ''}")
    return 0

"""`chatq session list|show|delete` and `chatq history`: sessions and their history from the command line.

    chatq session list [--json] [--limit N] [--cursor C] [--metadata KEY=VALUE]... [--tenant T]
    chatq session show SESSION [--json]
    chatq session delete SESSION [--json]
    chatq history SESSION [--json] [--limit N] [--before CURSOR]

Lists are pages: the command prints how to ask for the next one (on stderr, so stdout stays the
page). Errors are one line on stderr and exit code 1 (`worker.cli.commands.main`). Only the
standard library is imported at module level, so `chatq` starts fast whatever runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DEFAULT_LIMIT = 20


def register_actions(actions: Any) -> None:
    """Add `list`, `show` and `delete` to `chatq session`."""
    listing = actions.add_parser("list", help="list sessions, newest first, a page at a time")
    listing.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"sessions per page (default {DEFAULT_LIMIT})"
    )
    listing.add_argument("--cursor", help="the page after this cursor (printed under the previous page)")
    listing.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only sessions whose metadata has KEY set to the string VALUE (repeatable)",
    )
    listing.add_argument("--tenant", help="only the sessions of this tenant (CHATQ_API_TOKENS)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    show = actions.add_parser("show", help="show a session: model, instructions, metadata, knowledge bases")
    show.add_argument("session", metavar="SESSION")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)

    delete = actions.add_parser("delete", help="stop a session's turns and delete it with its history")
    delete.add_argument("session", metavar="SESSION")
    delete.add_argument("--json", action="store_true", help="print JSON")
    delete.set_defaults(func=cmd_delete)


def register(sub: Any) -> None:
    """Add `chatq history`."""
    history = sub.add_parser("history", help="a session's turns with their messages, the newest page first")
    history.add_argument("session", metavar="SESSION")
    history.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"turns per page (default {DEFAULT_LIMIT})")
    history.add_argument("--before", metavar="CURSOR", help="the older turns before this cursor")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=cmd_history)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _metadata_filter(pairs: list[str]) -> dict[str, str]:
    from worker.errors import CliError

    wanted: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise CliError(f"--metadata takes KEY=VALUE, got {pair!r}")
        wanted[key] = value
    return wanted


def cmd_list(args: argparse.Namespace) -> int:
    from worker.producer import list_sessions

    page = list_sessions(
        limit=args.limit, cursor=args.cursor, metadata=_metadata_filter(args.metadata) or None, tenant=args.tenant
    )
    if args.json:
        _print_json({"sessions": page.sessions, "next_cursor": page.next_cursor})
        return 0
    for session in page.sessions:
        metadata = json.dumps(session["metadata"], ensure_ascii=False) if session["metadata"] else ""
        print(
            f"{session['id']}  {session['created_at'][:19]}  {session['turns']:>5} turn(s)  "
            f"{session['framework']}/{session['model'] or '(worker default)'}"
            + (f"  tenant {session['tenant']}" if session["tenant"] else "")
            + (f"  {metadata}" if metadata else "")
        )
    if page.next_cursor:
        print(f"more: chatq session list --limit {args.limit} --cursor {page.next_cursor}", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from worker.producer import get_session

    session = get_session(args.session)
    if args.json:
        _print_json(session)
        return 0
    print(f"session        {session['id']}")
    print(f"framework      {session['framework']}")
    print(f"model          {session['model'] or '(worker default)'}")
    if session["tenant"]:
        print(f"tenant         {session['tenant']}")
    print(f"turns          {session['turns']}")
    print(f"created        {session['created_at']}")
    print(f"last active    {session['last_active_at']}")
    if session["knowledge_bases"]:
        print(f"knowledge      {', '.join(session['knowledge_bases'])}")
    if session["metadata"]:
        print(f"metadata       {json.dumps(session['metadata'], ensure_ascii=False)}")
    if session["system_prompt"]:
        print(f"system prompt  {session['system_prompt']}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from worker.producer import delete_session

    report = delete_session(args.session)
    if args.json:
        _print_json({"session_id": str(report.session_id), "turns": report.turns, "stopped": report.stopped})
        return 0
    stopped = f", {len(report.stopped)} of them stopped first" if report.stopped else ""
    print(f"session {report.session_id} deleted with {report.turns} turn(s){stopped}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from worker.producer import list_turns

    page = list_turns(args.session, limit=args.limit, before=args.before)
    if args.json:
        _print_json({"turns": page.turns, "next_cursor": page.next_cursor})
        return 0
    for number, turn in enumerate(page.turns):
        if number:
            print()
        error = f": {turn['error']}" if turn["error"] else ""
        print(f"--- turn {turn['id']}  position {turn['position']}  {turn['status']}{error}")
        for message in turn["messages"]:
            if message["tool_calls"]:
                calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('args'))})" for c in message["tool_calls"])
                print(f"[{message['role']}] calls {calls}")
            if message["content"] or not message["tool_calls"]:
                print(f"[{message['role']}] {message['content']}")
    if page.next_cursor:
        print(f"older: chatq history {args.session} --limit {args.limit} --before {page.next_cursor}", file=sys.stderr)
    return 0

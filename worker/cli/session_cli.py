"""`chatq session create|list|show|update|delete` and `chatq history`: sessions and their history from the command line.

    chatq session create [--framework F] [--model NAME] [--system-prompt TEXT] [--kb KB]... [--webhook URL]
                         [--approval POLICY] [--metadata KEY=VALUE]... [--tenant T] [--json]
    chatq session list [--json] [--limit N] [--cursor C] [--metadata KEY=VALUE]... [--tenant T]
    chatq session show SESSION [--json]
    chatq session update SESSION [--model NAME | --default-model] [--system-prompt TEXT | --no-system-prompt]
                         [--metadata KEY=VALUE... | --no-metadata] [--kb KB... | --no-kb]
                         [--webhook URL | --no-webhook] [--approval POLICY] [--json]
    chatq session delete SESSION [--json]
    chatq history SESSION [--json] [--limit N] [--before CURSOR]

Lists are pages: the command prints how to ask for the next one (on stderr, so stdout stays the
page). Errors are one line on stderr and exit code 1 (`worker.cli.commands.main`); a bad option value
such as a `--tenant` name is a usage error (exit 2). Only the
standard library is imported at module level, so `chatq` starts fast whatever runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatq.settings import Settings

DEFAULT_LIMIT = 20


def register_actions(actions: Any) -> None:
    """Add `create`, `list`, `show`, `update` and `delete` to `chatq session`."""
    create = actions.add_parser("create", help="create a session and print its id")
    create.add_argument(
        "--framework",
        default="langgraph",
        help="agent framework: langgraph (default), none, plain_openai or one a CHATQ_PLUGINS module registers",
    )
    create.add_argument(
        "--model", help="model name (default: the worker's default model, CHATQ_MODEL of the worker running a turn)"
    )
    create.add_argument("--system-prompt", help="the session's own instructions")
    create.add_argument(
        "--kb", action="append", default=[], metavar="KB", help="attach this knowledge base (repeatable)"
    )
    create.add_argument("--webhook", metavar="URL", help="POST each turn here when it ends (http or https)")
    create.add_argument(
        "--approval", metavar="POLICY", help="tool calls a person approves: none, paid, all or TOOL,TOOL,..."
    )
    create.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="store KEY with the string VALUE in its metadata (repeatable; `session list --metadata` filters on it)",
    )
    create.add_argument(
        "--tenant",
        type=tenant_arg,
        help="the tenant that owns it (a scoped gateway token of it sees it; usage counts it)",
    )
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(func=cmd_create)

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

    _register_update(actions)

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


def _register_update(actions: Any) -> None:
    update = actions.add_parser(
        "update",
        help="change a session's model, instructions, metadata, knowledge bases or webhook",
        description="Change what is given; the session's next turns see it (a running turn finishes as it started). "
        "--metadata and --kb replace the whole metadata or set of knowledge bases, as PATCH /sessions/{id} does.",
    )
    update.add_argument("session", metavar="SESSION")
    model = update.add_mutually_exclusive_group()
    model.add_argument("--model", help="run its turns on this model")
    model.add_argument("--default-model", action="store_true", help="run its turns on the worker's default model")
    prompt = update.add_mutually_exclusive_group()
    prompt.add_argument("--system-prompt", help="the session's own instructions")
    prompt.add_argument("--no-system-prompt", action="store_true", help="remove its instructions")
    metadata = update.add_mutually_exclusive_group()
    metadata.add_argument(
        "--metadata",
        action="append",
        metavar="KEY=VALUE",
        help="the session's metadata becomes exactly these pairs (repeatable; a key left out is removed)",
    )
    metadata.add_argument("--no-metadata", action="store_true", help="remove all its metadata")
    kbs = update.add_mutually_exclusive_group()
    kbs.add_argument(
        "--kb", action="append", metavar="KB", help="attach exactly these knowledge bases (repeatable; replaces)"
    )
    kbs.add_argument("--no-kb", action="store_true", help="detach all its knowledge bases")
    webhook = update.add_mutually_exclusive_group()
    webhook.add_argument("--webhook", metavar="URL", help="POST each turn here when it ends (http or https)")
    webhook.add_argument("--no-webhook", action="store_true", help="stop POSTing its turns")
    update.add_argument(
        "--approval", metavar="POLICY", help="tool calls a person approves: none, paid, all or TOOL,TOOL,..."
    )
    update.add_argument("--json", action="store_true", help="print the session after the change as JSON")
    update.set_defaults(func=cmd_update)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def tenant_arg(value: str) -> str:
    """A `--tenant` value: a tenant name (`chatq.tenants`), else a usage error (exit 2) before anything runs."""
    from chatq.errors import InvalidTenant
    from chatq.tenants import validate_tenant

    try:
        return validate_tenant(value)
    except InvalidTenant as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def metadata_pairs(pairs: list[str]) -> dict[str, str]:
    """`--metadata KEY=VALUE` options as a dict (the value is a string, maybe empty; a later KEY wins)."""
    from worker.errors import CliError

    wanted: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise CliError(f"--metadata takes KEY=VALUE, got {pair!r}")
        wanted[key] = value
    return wanted


def warn_model(model: str | None, settings: Settings) -> None:
    """Warn when `model` needs a key this terminal lacks (`settings`, the CLI's): only a warning, the
    worker runs the turns."""
    if model and settings.model_unavailable(model):
        print(
            f"chatq: warning: model {model.strip()!r} needs OPENAI_API_KEY or OPENAI_BASE_URL, and this "
            "terminal sets neither. The session was stored; its turns run in a worker, so the worker's "
            "environment is what counts: they fail unless the worker sets one of them.",
            file=sys.stderr,
        )


def cmd_create(args: argparse.Namespace) -> int:
    from worker.cli.approval_cli import approval_value
    from worker.producer import create_session

    session_id = create_session(
        framework=args.framework,
        model=args.model,
        system_prompt=args.system_prompt,
        metadata=metadata_pairs(args.metadata),
        knowledge_bases=args.kb,
        webhook=args.webhook,
        approval=None if args.approval is None else approval_value(args.approval),
        tenant=args.tenant,
    )
    # Only a warning: the worker, not this terminal, runs the turns and may well have the key.
    warn_model(args.model, args.settings)
    if args.json:
        _print_json({"session_id": str(session_id)})
    else:
        print(session_id)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from worker.producer import list_sessions

    page = list_sessions(
        limit=args.limit, cursor=args.cursor, metadata=metadata_pairs(args.metadata) or None, tenant=args.tenant
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
    _print_session(session)
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from worker.cli.approval_cli import approval_value
    from worker.errors import CliError
    from worker.producer import KEEP, update_session

    def pick(value: Any, clear: bool) -> Any:
        return None if clear else KEEP if value is None else value

    changes: dict[str, Any] = {
        "model": pick(args.model, args.default_model),
        "system_prompt": pick(args.system_prompt, args.no_system_prompt),
        "metadata": pick(None if args.metadata is None else metadata_pairs(args.metadata), args.no_metadata),
        "knowledge_bases": [] if args.no_kb else KEEP if args.kb is None else args.kb,
        "webhook": pick(args.webhook, args.no_webhook),
        "approval": KEEP if args.approval is None else approval_value(args.approval),
    }
    if all(value is KEEP for value in changes.values()):
        raise CliError(
            "nothing to change: give --model, --default-model, --system-prompt, --no-system-prompt, --metadata, "
            "--no-metadata, --kb, --no-kb, --webhook, --no-webhook or --approval"
        )
    session = update_session(args.session, **changes)
    if isinstance(changes["model"], str):
        warn_model(changes["model"], args.settings)
    if args.json:
        _print_json(session)
    else:
        _print_session(session)
    return 0


def _print_session(session: dict[str, Any]) -> None:
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
    if session.get("webhook"):
        print(f"webhook        {session['webhook']}")
    if session["system_prompt"]:
        print(f"system prompt  {session['system_prompt']}")


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

"""`chatq schedule add|list|show|update|pause|resume|delete` (docs/contract.md, "Schedules").

    chatq schedule add (--session SESSION | --framework F [--model M] [--system-prompt T] [--tenant T])
                       (--cron EXPR [--timezone ZONE] | --every SECONDS) [--overlap skip|enqueue]
                       [--misfire skip|once|all] [--start-at TIME] [--end-at TIME] [--max-runs N]
                       [--name NAME] [--paused] [--json] CONTENT
    chatq schedule list [--tenant T] [--json]
    chatq schedule show SCHEDULE [--runs N] [--json]
    chatq schedule update SCHEDULE [--content TEXT] [--cron EXPR | --every SECONDS] [--timezone ZONE]
                          [--overlap P] [--misfire P] [--end-at TIME | --no-end] [--max-runs N | --no-max-runs]
                          [--name NAME] [--json]
    chatq schedule pause|resume|delete SCHEDULE

Errors are one line on stderr and exit code 1 (`worker.cli.commands.main`); a bad `--tenant` name
is a usage error (exit 2). Only the standard library (and `worker.cli.session_cli`, which imports
no more) is imported at module level.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from worker.cli.session_cli import tenant_arg

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add `chatq schedule` and its actions."""
    schedule = sub.add_parser("schedule", help="turns submitted on a cron expression or every N seconds")
    actions = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")

    add = actions.add_parser("add", help="create a schedule and print it")
    add.add_argument("content", metavar="CONTENT", help="the user message of each run")
    target = add.add_mutually_exclusive_group()
    target.add_argument("--session", metavar="SESSION", help="each run is a turn of this session")
    target.add_argument("--framework", help="each run is a new session of this framework (the default: langgraph)")
    add.add_argument("--model", help="a new session's model (with --framework or no --session)")
    add.add_argument("--system-prompt", help="a new session's instructions")
    add.add_argument("--tenant", type=tenant_arg, help="the tenant of the schedule and of each run's new session")
    timing = add.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPR", help="a five-field cron expression, e.g. '*/5 * * * *'")
    timing.add_argument("--every", type=float, metavar="SECONDS", help="seconds between runs (at least 1)")
    add.add_argument("--timezone", default="UTC", metavar="ZONE", help="the zone --cron is read in (default UTC)")
    add.add_argument("--overlap", choices=["skip", "enqueue"], default="skip", help="a tick while a run is unfinished")
    add.add_argument("--misfire", choices=["skip", "once", "all"], default="once", help="ticks missed while down")
    add.add_argument("--start-at", metavar="TIME", help="no run before this ISO 8601 time")
    add.add_argument("--end-at", metavar="TIME", help="no run after this ISO 8601 time")
    add.add_argument("--max-runs", type=int, metavar="N", help="stop after N runs")
    add.add_argument("--name", help="a name for people")
    add.add_argument("--paused", action="store_true", help="create it paused")
    add.add_argument("--json", action="store_true", help="print JSON")
    add.set_defaults(func=cmd_add)

    listing = actions.add_parser("list", help="list schedules, newest first")
    listing.add_argument("--tenant", help="only this tenant's schedules")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    show = actions.add_parser("show", help="a schedule, its next run and its last runs with their status")
    show.add_argument("schedule", metavar="SCHEDULE")
    show.add_argument("--runs", type=int, default=10, metavar="N", help="how many of the last runs (default 10)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)

    update = actions.add_parser("update", help="change what is given; a new timing counts from now")
    update.add_argument("schedule", metavar="SCHEDULE")
    update.add_argument("--content", help="the user message of each run")
    new_timing = update.add_mutually_exclusive_group()
    new_timing.add_argument("--cron", metavar="EXPR")
    new_timing.add_argument("--every", type=float, metavar="SECONDS")
    update.add_argument("--timezone", metavar="ZONE")
    update.add_argument("--overlap", choices=["skip", "enqueue"])
    update.add_argument("--misfire", choices=["skip", "once", "all"])
    end = update.add_mutually_exclusive_group()
    end.add_argument("--end-at", metavar="TIME")
    end.add_argument("--no-end", action="store_true", help="remove end_at")
    runs = update.add_mutually_exclusive_group()
    runs.add_argument("--max-runs", type=int, metavar="N")
    runs.add_argument("--no-max-runs", action="store_true", help="remove max_runs")
    update.add_argument("--name")
    update.add_argument("--json", action="store_true", help="print JSON")
    update.set_defaults(func=cmd_update)

    for verb, helping in (
        ("pause", "stop firing it until resumed"),
        ("resume", "fire it again from its next tick (ticks missed while paused do not run)"),
        ("delete", "delete it (the turns it made stay)"),
    ):
        action = actions.add_parser(verb, help=helping)
        action.add_argument("schedule", metavar="SCHEDULE")
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(func=cmd_lifecycle, verb=verb)


def _print(schedule: Any, as_json: bool, runs: list[Any] | None = None) -> None:
    body = schedule.as_dict()
    if runs is not None:
        body["last_runs"] = [
            {"turn_id": str(r.turn_id), "session_id": str(r.session_id), "status": r.status, "at": str(r.created_at)}
            for r in runs
        ]
    if as_json:
        print(json.dumps(body, indent=2))
        return
    timing = (body["cron"] and f"cron {body['cron']!r} ({body['timezone']})") or f"every {body['every']:g}s"
    state = "enabled" if body["enabled"] else ("done" if body["next_run_at"] is None else "paused")
    print(f"{body['id']}  {timing}  {state}  next {body['next_run_at'] or '-'}  runs {body['runs']}")
    if runs is not None:
        target = body["session_id"] or "a new session per run"
        print(f"  content: {body['content'][:100]!r}  in {target}; skipped {body['skipped']}")
        for run in body["last_runs"]:
            print(f"  {run['at']}  {run['turn_id']}  {run['status']}")


def cmd_add(args: argparse.Namespace) -> int:
    from worker.errors import CliError
    from worker.producer import create_schedule

    if args.session is not None and args.tenant is not None:
        # A schedule on a session is that session's tenant's: there is nothing to set.
        raise CliError("--tenant is for a schedule's new sessions; one on --session takes that session's tenant")
    template = None
    if args.session is None:
        template = {
            "framework": args.framework or "langgraph",
            "model": args.model,
            "system_prompt": args.system_prompt,
        }
    schedule = create_schedule(
        content=args.content,
        session_id=args.session,
        session_template=template,
        cron=args.cron,
        every=args.every,
        timezone=args.timezone,
        overlap=args.overlap,
        misfire=args.misfire,
        start_at=args.start_at,
        end_at=args.end_at,
        max_runs=args.max_runs,
        enabled=not args.paused,
        name=args.name,
        tenant=args.tenant,
    )
    _print(schedule, args.json)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from worker.producer import list_schedules

    schedules = list_schedules(tenant=args.tenant)
    if args.json:
        print(json.dumps([s.as_dict() for s in schedules], indent=2))
        return 0
    if not schedules:
        print("no schedules")
    for schedule in schedules:
        _print(schedule, False)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from worker.producer import get_schedule, schedule_runs

    _print(get_schedule(args.schedule), args.json, schedule_runs(args.schedule, limit=args.runs))
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from worker.producer import KEEP, update_schedule

    changes: dict[str, Any] = {}
    for name in ("content", "cron", "every", "timezone", "overlap", "misfire", "end_at", "max_runs", "name"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.no_end:
        changes["end_at"] = None
    if args.no_max_runs:
        changes["max_runs"] = None
    if not changes:
        from worker.errors import CliError

        raise CliError("nothing to change: give --content, --cron, --every, --timezone, ... (see --help)")
    _print(update_schedule(args.schedule, **{k: changes.get(k, KEEP) for k in changes}), args.json)
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    from worker.producer import delete_schedule, pause_schedule, resume_schedule

    if args.verb == "delete":
        deleted = delete_schedule(args.schedule)
        print(
            json.dumps({"schedule_id": str(deleted), "deleted": True}) if args.json else f"schedule {deleted} deleted"
        )
        return 0
    schedule = (pause_schedule if args.verb == "pause" else resume_schedule)(args.schedule)
    _print(schedule, args.json)
    return 0

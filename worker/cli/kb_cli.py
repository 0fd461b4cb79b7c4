"""`chatq kb ...`: knowledge bases from the command line.

    chatq kb create NAME [--description TEXT] [--tenant TENANT]
    chatq kb list [--tenant TENANT]
    chatq kb tenant KB [TENANT]          give a knowledge base to a tenant (none: the operator's)
    chatq kb add KB FILE...              text and markdown files; adding a file again updates it
    chatq kb search KB "query" [--limit N]
    chatq kb attach SESSION KB...        the session's turns search these first and cite them
    chatq kb detach SESSION KB...

A knowledge base of a tenant serves only that tenant's sessions; one without serves sessions
created without a tenant token. These commands are the operator's: they see every knowledge base.
Every command takes `--json`. Errors are one line on stderr and exit code 1 (`worker.cli.commands.main`).
Only the standard library is imported at module level, so `chatq` starts fast whatever runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    """Add the `kb` command and its actions."""
    kb = sub.add_parser("kb", help="knowledge bases: create, add documents, search, attach to sessions")
    actions = kb.add_subparsers(dest="kb_command", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create an empty knowledge base")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--description", help="what the knowledge base holds")
    create.add_argument("--tenant", help="the tenant it belongs to (only its sessions can use it)")
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(func=cmd_create)

    listing = actions.add_parser("list", help="list knowledge bases with their document and chunk counts")
    listing.add_argument("--tenant", help="only this tenant's knowledge bases")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)

    owner = actions.add_parser("tenant", help="give a knowledge base to a tenant (without TENANT: to no tenant)")
    owner.add_argument("kb", metavar="KB")
    owner.add_argument("tenant", metavar="TENANT", nargs="?")
    owner.add_argument("--json", action="store_true", help="print JSON")
    owner.set_defaults(func=cmd_tenant)

    add = actions.add_parser("add", help="add text or markdown files (adding a file again updates it)")
    add.add_argument("kb", metavar="KB")
    add.add_argument("files", metavar="FILE", nargs="+")
    add.add_argument("--json", action="store_true", help="print JSON")
    add.set_defaults(func=cmd_add)

    search = actions.add_parser("search", help="full-text search of a knowledge base, best passages first")
    search.add_argument("kb", metavar="KB")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--limit", type=int, default=5, help="how many passages (default 5, at most 50)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(func=cmd_search)

    attach = actions.add_parser("attach", help="attach knowledge bases to a session")
    attach.add_argument("session", metavar="SESSION")
    attach.add_argument("kbs", metavar="KB", nargs="+")
    attach.add_argument("--json", action="store_true", help="print JSON")
    attach.set_defaults(func=cmd_attach)

    detach = actions.add_parser("detach", help="detach knowledge bases from a session")
    detach.add_argument("session", metavar="SESSION")
    detach.add_argument("kbs", metavar="KB", nargs="+")
    detach.add_argument("--json", action="store_true", help="print JSON")
    detach.set_defaults(func=cmd_detach)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def cmd_create(args: argparse.Namespace) -> int:
    from models.knowledge import create_knowledge_base

    info = create_knowledge_base(args.name, args.description, tenant=args.tenant)
    if args.json:
        _print_json(info.to_dict())
    else:
        print(f"knowledge base {info.name!r} created" + (f" for tenant {info.tenant}" if info.tenant else ""))
    return 0


def cmd_tenant(args: argparse.Namespace) -> int:
    from models.knowledge import set_knowledge_base_tenant

    info = set_knowledge_base_tenant(args.kb, args.tenant)
    if args.json:
        _print_json(info.to_dict())
    else:
        print(f"knowledge base {info.name!r} belongs to " + (f"tenant {info.tenant}" if info.tenant else "no tenant"))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from models.knowledge import EVERY_TENANT, list_knowledge_bases

    bases = list_knowledge_bases(EVERY_TENANT if args.tenant is None else args.tenant)
    if args.json:
        _print_json([info.to_dict() for info in bases])
        return 0
    if not bases:
        print("no knowledge bases (create one with `chatq kb create NAME`)")
        return 0
    width = max(len(info.name) for info in bases)
    for info in bases:
        line = f"{info.name:<{width}}  {info.documents:>5} documents  {info.chunks:>6} chunks"
        line += f"  tenant {info.tenant}" if info.tenant else ""
        print(f"{line}  {info.description}" if info.description else line)
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from models.knowledge import add_files

    added = add_files(args.kb, args.files)
    if args.json:
        _print_json({"knowledge_base": args.kb, "documents": [document.to_dict() for document in added]})
        return 0
    for document in added:
        noun = "chunk" if document.chunks == 1 else "chunks"
        print(
            f"{document.status:<9} document {document.document_id}  {document.title!r}"
            f"  ({document.chunks} {noun})  {document.source_path}"
        )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from models.search import MAX_SEARCH_LIMIT, search
    from worker.errors import ChatqError

    if not 1 <= args.limit <= MAX_SEARCH_LIMIT:
        raise ChatqError(f"--limit must be between 1 and {MAX_SEARCH_LIMIT}")
    hits = search([args.kb], args.query, limit=args.limit)
    if args.json:
        _print_json({"knowledge_base": args.kb, "query": args.query, "results": [hit.to_dict() for hit in hits]})
        return 0
    if not hits:
        print("no matching passages")
        return 0
    for index, hit in enumerate(hits, start=1):
        print(f"{index}. {hit.title}  (document {hit.document_id}, chunk {hit.chunk_id}, rank {hit.rank:.3f})")
        print(f"   {hit.snippet}")
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    from models.errors import KnowledgeBaseNotFound
    from models.knowledge import attach_knowledge_bases, list_knowledge_bases, normalize_name

    try:
        names = attach_knowledge_bases(args.session, args.kbs)
    except KnowledgeBaseNotFound:
        # The operator sees every tenant's: say whose it is rather than "unknown".
        from worker.history import get_session

        owners = {info.name: info.tenant for info in list_knowledge_bases()}
        tenant = get_session(args.session)["tenant"]
        for name in map(normalize_name, args.kbs):
            if name in owners and owners[name] != tenant:
                owner = f"tenant {owners[name]}" if owners[name] else "no tenant"
                raise KnowledgeBaseNotFound(
                    f"knowledge base {name!r} belongs to {owner}, not to the session's tenant: a session "
                    f"uses only its own tenant's (`chatq kb tenant {name} TENANT` gives it to another)"
                ) from None
        raise
    return _print_session(args, names)


def cmd_detach(args: argparse.Namespace) -> int:
    from models.knowledge import detach_knowledge_bases

    names = detach_knowledge_bases(args.session, args.kbs)
    return _print_session(args, names)


def _print_session(args: argparse.Namespace, names: list[str]) -> int:
    if args.json:
        _print_json({"session_id": args.session, "knowledge_bases": names})
    else:
        print(f"session {args.session} knowledge bases: {', '.join(names) if names else '(none)'}")
    return 0

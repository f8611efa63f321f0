"""``gateway memory list|show|delete``: the model-written memory scopes, for the operator.

``list [--tenant T]`` names every memory scope (person or chat) with its file count and size;
``show --user CHANNEL:ID`` or ``--chat CHANNEL:ID`` (``--tenant T``, default ``default``)
prints a scope's files; ``delete`` with the same options removes them and prints what was
removed. The operator layer (SOUL.md, USER.md, MEMORY.md, skills/, kb/) and tenant layers
are plain files the operator edits directly; this command never touches them. A running
gateway picks up a deletion at its next prompt build (hot reload). To erase a person
entirely (their sessions too, with a tombstone), use ``gateway forget``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, CommandError
from gateway.edge.scopes import Scope, ScopeError, ScopeKind, parse_ref
from sessions.names import DEFAULT_TENANT

if TYPE_CHECKING:
    from app.config import Settings

DESCRIPTION = """\
What the agent saved (memory_write, kb_write, mood_set) is kept per person, for one-to-one
chats, and per chat, for groups and channels. List those memory scopes, show one, or delete one.
Your own layers (SOUL.md, USER.md, MEMORY.md, skills/, kb/, tenants/) are files you edit."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="every memory scope (of one tenant with --tenant)")
    listing.add_argument("--tenant", default=None, help="only this tenant's scopes")
    for name, text in (("show", "print a scope's memory files"),
                       ("delete", "delete a scope's memory files")):
        p = sub.add_parser(name, help=text)
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", metavar="CHANNEL:ID",
                         help="a person's scope (their one-to-one conversations)")
        who.add_argument("--chat", metavar="CHANNEL:ID",
                         help="a chat's scope (a group, a channel)")
        p.add_argument("--tenant", default=DEFAULT_TENANT,
                       help=f"the scope's tenant (default: {DEFAULT_TENANT})")
    for p in (listing, *(sub.choices[n] for n in ("show", "delete"))):
        p.add_argument("--data-dir", type=Path, default=None,
                       help="data directory (GATEWAY_DATA_DIR)")
        p.add_argument("--persona-dir", type=Path, default=None,
                       help="persona workspace (GATEWAY_PERSONA_DIR; default DATA/persona)")


def scope_from(args: argparse.Namespace) -> Scope:
    """The scope ``--user``/``--chat`` and ``--tenant`` name (a usage error if malformed)."""
    kind: ScopeKind = "person" if args.user is not None else "chat"
    try:
        return parse_ref(args.user if args.user is not None else args.chat, kind, args.tenant)
    except ScopeError as exc:
        raise CommandError(str(exc)) from exc


def run(args: argparse.Namespace, settings: Settings, out: TextIO | None = None) -> int:
    from gateway.persona.memory_scopes import delete_scope, list_scopes, scope_files

    out = out or sys.stdout
    root = settings.persona_root
    if args.action == "list":
        try:
            found = list_scopes(root, args.tenant)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        out.write(f"{'TENANT':<16} {'KIND':<7} {'SCOPE':<40} {'FILES':>5} {'BYTES':>8}\n")
        for item in found:
            if item.scope is None:
                tenant, kind, label = item.path.split("/", 1)[0], "?", item.path
            else:
                tenant, kind = item.scope.tenant, item.scope.kind
                label = f"{item.scope.channel}:{item.scope.id}"
            out.write(f"{tenant:<16} {kind:<7} {label:<40} {item.files:>5} {item.size:>8}\n")
        return EXIT_OK
    scope = scope_from(args)
    where = f"{scope.kind} {scope.channel}:{scope.id} (tenant {scope.tenant})"
    if args.action == "show":
        files = scope_files(root, scope)
        if not files:
            sys.stderr.write(f"gateway memory: no memory for {where}\n")
            return EXIT_UNREADABLE
        for rel, text in files:
            out.write(f"== {rel}\n{text}{'' if text.endswith(chr(10)) else chr(10)}")
        return EXIT_OK
    removed = delete_scope(root, scope)
    out.write(f"deleted the memory of {where}: {len(removed)} file(s)\n")
    for rel in removed:
        out.write(f"  {rel}\n")
    return EXIT_OK

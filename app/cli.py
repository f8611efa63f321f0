"""The ``gateway`` command: parses arguments and dispatches to :mod:`app.commands`.

Subcommands: ``run`` (serve the channels), ``chat`` (talk in the terminal), ``replay`` (with
``--rerun``), ``drift``, ``export``, ``sessions``, ``viewer``, ``pairing``, ``db``. Every
subcommand turns expected failures into one line on stderr and an exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app import compose
from app.commands import chat as chat_cmd
from app.commands import db as db_cmd
from app.commands import drift as drift_cmd
from app.commands import export as export_cmd
from app.commands import pairing as pairing_cmd
from app.commands import replay as replay_cmd
from app.commands import run as run_cmd
from app.commands import sessions as sessions_cmd
from app.commands import sessions_db as sessions_db_cmd
from app.commands import viewer as viewer_cmd
from app.commands.common import EXIT_UNREADABLE, CommandError, OneLineParser
from sessions.errors import SessionError
from sessions.store import SessionStore


def default_data_dir() -> Path:
    return Path(os.environ.get("GATEWAY_DATA_DIR") or "./data")


def open_store(data_dir: Path, store_url: str | None = None,
               schema: str | None = None) -> SessionStore:
    """The store for read-side commands: PostgreSQL when ``--store-url`` or
    ``GATEWAY_STORE_URL`` names a database, else JSONL under ``data_dir``."""
    url = db_cmd.store_url(store_url)
    if schema is None:
        return compose.open_store(data_dir, url)
    return compose.open_store(data_dir, url, schema=schema)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    p = sub.add_parser("run", prog="gateway run", help="serve the configured channels")
    run_cmd.add_arguments(p)
    p = sub.add_parser("chat", prog="gateway chat", help="chat in the terminal")
    chat_cmd.add_arguments(p)
    p = sub.add_parser("replay", prog="gateway replay", help="rebuild provider calls offline")
    replay_cmd.add_arguments(p)
    p.add_argument("--data-dir", type=Path, default=None)
    p = sub.add_parser("drift", prog="gateway drift", help="prompt drift per section")
    drift_cmd.add_arguments(p)
    p = sub.add_parser("export", prog="gateway export", help="export calls (OTel GenAI, JSONL)")
    export_cmd.add_arguments(p)
    p = sub.add_parser("sessions", prog="gateway sessions", help="prune sessions, size report")
    sessions_cmd.add_arguments(p)
    p = sub.add_parser("viewer", prog="gateway viewer", help="browse sessions (read-only web UI)")
    viewer_cmd.add_arguments(p)
    p = sub.add_parser("db", prog="gateway db", help="PostgreSQL store schema: upgrade, status")
    db_cmd.add_arguments(p)
    p = sub.add_parser("pairing", prog="gateway pairing", help="approve or revoke DM pairing")
    pairing_cmd.add_arguments(p)
    p.add_argument("--data-dir", type=Path, default=None)
    for name in ("replay", "drift", "export", "viewer"):
        sub.choices[name].add_argument(
            "--store-url", default=None,
            help="read sessions from this postgresql:// database (GATEWAY_STORE_URL)")
        db_cmd.add_schema_argument(sub.choices[name])
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return await run_cmd.run(args)
    if args.command == "chat":
        return await chat_cmd.run(args)
    if args.command == "db":
        return await db_cmd.run(args)
    data_dir = args.data_dir or default_data_dir()
    if args.command == "replay":
        store = open_store(data_dir, args.store_url, args.schema)
        try:
            return await replay_cmd.run(args, store, data_dir=data_dir)
        finally:
            await store.aclose()
    if args.command == "sessions" and args.action in sessions_db_cmd.ACTIONS:
        store = open_store(data_dir, args.store_url, args.schema)
        try:
            return await sessions_db_cmd.run(args, store)
        finally:
            await store.aclose()
    if args.command == "sessions":
        return sessions_cmd.run(args, data_dir)
    if args.command == "pairing":
        return pairing_cmd.run(args, data_dir)
    if args.command == "viewer":
        store = open_store(data_dir, args.store_url, args.schema)
        try:
            return await viewer_cmd.run(args, store, data_dir)
        finally:
            await store.aclose()
    if args.command in ("drift", "export"):
        store = open_store(data_dir, args.store_url, args.schema)
        try:
            if args.command == "drift":
                return await drift_cmd.run(args, store)
            return await export_cmd.run(args, store)
        finally:
            await store.aclose()
    raise CommandError("unknown command")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra:  # named after the subcommand, like every other usage error
        sys.stderr.write(f"gateway {args.command}: unrecognized arguments: {' '.join(extra)}\n")
        return 2
    try:
        return asyncio.run(_dispatch(args))
    except BrokenPipeError:
        # The reader went away (``gateway export ... | head``): not an error worth a traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CommandError as exc:
        sys.stderr.write(f"gateway {args.command}: {exc}\n")
        return exc.code
    except SessionError as exc:  # e.g. the database is unreachable or its schema is old
        sys.stderr.write(f"gateway {args.command}: {exc}\n")
        return EXIT_UNREADABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

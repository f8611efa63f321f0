"""The ``gateway`` command: the composition root, the only place that wires concrete parts.

Subcommands: ``run`` (serve the channels), ``chat`` (talk in the terminal), ``replay``. Every
subcommand turns expected failures into one line on stderr and an exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.commands import chat as chat_cmd
from gateway.commands import replay as replay_cmd
from gateway.commands import run as run_cmd
from gateway.commands.common import CommandError, OneLineParser
from sessions.jsonl import JsonlSessionStore
from sessions.store import SessionStore


def default_data_dir() -> Path:
    return Path(os.environ.get("GATEWAY_DATA_DIR") or "./data")


def open_store(data_dir: Path) -> SessionStore:
    """The store for read-side commands (JSONL under ``data_dir``)."""
    return JsonlSessionStore(data_dir)


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
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return await run_cmd.run(args)
    if args.command == "chat":
        return await chat_cmd.run(args)
    data_dir = args.data_dir or default_data_dir()
    if args.command == "replay":
        store = open_store(data_dir)
        try:
            return await replay_cmd.run(args, store)
        finally:
            await store.aclose()
    raise CommandError("unknown command")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return asyncio.run(_dispatch(args))
    except CommandError as exc:
        sys.stderr.write(f"gateway {args.command}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

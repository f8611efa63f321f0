# PYTHON_ARGCOMPLETE_OK  (tells argcomplete's global completion this script supports it)
"""The ``gateway`` command: parses arguments and dispatches to :mod:`app.commands`.

Every subcommand reads its settings as ``gateway run`` does (:func:`command_settings`: the
environment, then ``.env``, then the command's own flags on top), and turns expected failures
into one line on stderr and an exit code, never a traceback: 2 for usage, configuration and
start-up failures (bad setting, busy port, rejected token, unreachable platform), 1 for
unreadable data.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import time
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import argcomplete

from app.commands.common import EXIT_UNREADABLE, CommandError, OneLineParser
from app.hints import as_typed, cli_command
from app.version import version
from sessions.errors import SessionError

if TYPE_CHECKING:
    from app.config import Settings
    from sessions.pricing import PriceTable

DESCRIPTION = """\
A gateway from Telegram, Slack, a web chat and the terminal to one AI agent. Every provider
call is recorded before it is sent, so any answer can be replayed and examined later.
Settings come from the environment and a .env file (see config.example.env)."""

EPILOG = """\
common tasks:
  gateway run                          serve the configured channels (web chat on :8787)
  gateway chat                         talk to the agent in this terminal
  gateway replay --list                sessions, newest first
  gateway replay ID --call 2           exactly what the provider received in call 2
  gateway export --all --format otlp-json --out traces.jsonl
  gateway usage --since 7d --by user   what each person's calls cost this week
  gateway pairing approve CODE         let someone who wrote in a DM talk to the agent
  gateway forget --user telegram:1001  erase a person's memory and direct conversations
  gateway schedule list                reminders and schedules, when each fires next

Run "gateway COMMAND --help" for a command's options. Shell completion:
  eval "$(gateway completion bash)"    (or zsh, fish)"""


SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "serve the configured channels"),
    ("chat", "talk to the agent in the terminal"),
    ("replay", "list sessions, rebuild provider calls"),
    ("drift", "how each prompt section changed"),
    ("export", "export calls as OTLP/JSON traces or JSONL"),
    ("usage", "tokens and cost by conversation, person, model"),
    ("sessions", "prune old sessions, size, import/export"),
    ("prune", "apply the configured retention once"),
    ("viewer", "browse sessions in a read-only web page"),
    ("db", "PostgreSQL store schema: upgrade, status"),
    ("pairing", "approve or revoke people in DMs"),
    ("memory", "list, show or delete what the agent remembers"),
    ("forget", "erase a person (memory, direct sessions)"),
    ("schedule", "list, add or cancel scheduled turns"),
    ("tools", "MCP servers: status, tools, tenants"),
    ("completion", "print shell completion code"),
)
"""Name and one-line summary of every subcommand, in the order ``gateway --help`` lists them.
Each is the module ``app.commands.<name>`` (its ``DESCRIPTION`` and ``add_arguments``),
imported only when that command is the one being run, completed or described: the SDKs and
the server behind them cost seconds to import, and ``--version``, ``--help`` and a shell's
Tab must not wait for them."""

STORE_READERS = ("replay", "drift", "export", "viewer", "usage", "forget", "schedule", "prune")
"""Commands that read sessions from a store: they take ``--store-url`` and ``--schema``."""


def command(name: str) -> ModuleType:
    """The module of subcommand ``name`` (imported now, if it was not yet)."""
    return importlib.import_module(f"app.commands.{name}")


def build_parser(defined: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``defined``, every command is listed but only those named have
    their options defined (their modules imported), which is all a run or a completion
    needs (none, for ``--version`` and ``--help``)."""
    # The common tasks are spelled as this very command is typed here (.venv/bin/gateway
    # after `make run`), so each works as printed.
    typed = cli_command()
    epilog = (EPILOG.replace("  gateway ", f"  {typed} ").replace("$(gateway ", f"$({typed} ")
              .replace('"gateway COMMAND', f'"{typed} COMMAND'))
    parser = OneLineParser(prog="gateway", description=DESCRIPTION, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gateway {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, summary in SUBCOMMANDS:
        module = command(name) if defined is None or name in defined else None
        subparser = sub.add_parser(name, prog=f"gateway {name}", help=summary,
                                   description=module.DESCRIPTION if module else None)
        if module is None:
            continue
        module.add_arguments(subparser)
        if name in STORE_READERS:
            subparser.add_argument(
                "--store-url", default=None,
                help="read sessions from this postgresql:// database (GATEWAY_STORE_URL)")
            command("db").add_schema_argument(subparser)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option: ``gateway``
    itself takes no option with a value), or, while a shell is completing (argcomplete's
    ``COMP_LINE``), the one named on the line being typed."""
    if os.environ.get("_ARGCOMPLETE") and "COMP_LINE" in os.environ:
        line = os.environ["COMP_LINE"][:int(os.environ.get("COMP_POINT", "0")) or None]
        try:
            words = shlex.split(line)[1:]
        except ValueError:  # an unfinished quote: complete against the whole parser
            return None
        if not line.endswith(" ") and words:
            words = words[:-1]  # the word being typed is not chosen yet
        argv = words
    names = {name for name, _ in SUBCOMMANDS}
    for word in argv:
        if not word.startswith("-"):
            return word if word in names else None
    return None


def command_settings(args: argparse.Namespace) -> Settings:
    """The settings of ``gateway run`` (environment, then ``.env``), with the command's own
    ``--data-dir``, ``--persona-dir``, ``--store-url``/``--url`` and ``--schema`` on top."""
    from app.commands.run import load_settings

    return load_settings(
        GATEWAY_DATA_DIR=getattr(args, "data_dir", None),
        GATEWAY_PERSONA_DIR=getattr(args, "persona_dir", None),
        GATEWAY_STORE_URL=getattr(args, "store_url", None) or getattr(args, "url", None),
        GATEWAY_STORE_SCHEMA=getattr(args, "schema", None),
    )


async def _dispatch(args: argparse.Namespace) -> int:
    # Each command's module is imported here, when it runs (see SUBCOMMANDS).
    if args.command == "run":
        from app.commands import run as run_cmd

        return await run_cmd.run(args)
    if args.command == "chat":
        from app.commands import chat as chat_cmd

        return await chat_cmd.run(args)
    if args.command == "completion":
        from app.commands import completion as completion_cmd

        return completion_cmd.run(args)
    settings = command_settings(args)
    if args.command == "db":
        from app.commands import db as db_cmd

        return await db_cmd.run(args, settings)
    if args.command == "pairing":
        from app.commands import pairing as pairing_cmd

        return pairing_cmd.run(args, settings)
    if args.command == "prune":
        from app.commands import prune as prune_cmd

        return await prune_cmd.run(args, settings, sys.stdout)
    if args.command == "memory":
        from app.commands import memory as memory_cmd

        return memory_cmd.run(args, settings)
    if args.command == "tools":
        from app.commands import tools as tools_cmd

        return await tools_cmd.run(args, settings, sys.stdout)
    from app.commands import sessions_db as sessions_db_cmd

    if args.command == "sessions" and args.action not in sessions_db_cmd.ACTIONS:
        from app.commands import sessions as sessions_cmd

        code = sessions_cmd.run(args, settings.data_dir)
        if args.action == "prune" and code == 0:  # then the blobs no session refers to
            await _prune_blobs(args, settings)
        return code
    return await _with_store(args, settings)


async def _with_store(args: argparse.Namespace, settings: Settings) -> int:
    """The commands that read sessions from the configured store."""
    from app.compose_store import blob_store_for, build_store

    store = build_store(settings)
    try:
        if args.command == "replay":
            from app.commands import replay as replay_cmd

            return await replay_cmd.run(args, store, data_dir=settings.data_dir,
                                        blobs=blob_store_for(store, settings.data_dir))
        if args.command == "sessions":
            from app.commands import sessions_db as sessions_db_cmd

            return await sessions_db_cmd.run(args, store)
        if args.command == "viewer":
            from app.commands import viewer as viewer_cmd

            return await viewer_cmd.run(args, store, settings,
                                        blobs=blob_store_for(store, settings.data_dir))
        if args.command == "drift":
            from app.commands import drift as drift_cmd

            return await drift_cmd.run(args, store)
        if args.command == "export":
            from app.commands import export as export_cmd

            return await export_cmd.run(args, store,
                                        capture_content=settings.otel_capture_content)
        if args.command == "usage":
            from app.commands import usage as usage_cmd

            return await usage_cmd.run(args, store, _prices(settings))
        if args.command == "forget":
            from app.commands import forget as forget_cmd

            return await forget_cmd.run(args, store, settings)
        if args.command == "schedule":
            from app.commands import schedule as schedule_cmd

            return await schedule_cmd.run(args, store, settings)
    finally:
        await store.aclose()
    raise CommandError("unknown command")


def _prices(settings: Settings) -> PriceTable:
    from app.prices import load_prices
    from gateway.edge.errors import ConfigError

    try:
        return load_prices(settings.prices_file)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc


async def _prune_blobs(args: argparse.Namespace, settings: Settings) -> None:
    from app.commands import blob_prune as blob_prune_cmd
    from app.commands import sessions as sessions_cmd
    from app.compose_store import blob_store_for, build_store, rerun_store

    store = build_store(settings)
    reruns = rerun_store(settings.data_dir)
    blobs = blob_store_for(store, settings.data_dir)
    cutoff = time.time() - sessions_cmd.parse_duration(args.older_than)
    try:
        await blob_prune_cmd.prune_blobs([store, reruns], blobs, args.tenant, dry=args.dry_run,
                                         out=sys.stdout, older_than=cutoff)
    finally:
        await blobs.aclose()
        await reruns.aclose()
        await store.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = chosen_command(argv)
    parser = build_parser(defined=() if chosen is None else (chosen,))
    argcomplete.autocomplete(parser)  # answers a completing shell, then exits; else a no-op
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra:  # named after the subcommand, like every other usage error
        sys.stderr.write(f"gateway {args.command}: unrecognized arguments: {' '.join(extra)}\n")
        return 2
    import asyncio  # after parsing: --version, --help and completion never get here

    try:
        return asyncio.run(_dispatch(args))
    except BrokenPipeError:
        # The reader went away (``gateway export ... | head``): not an error worth a traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CommandError as exc:
        sys.stderr.write(f"gateway {args.command}: {_typed(str(exc))}\n")
        return exc.code
    except SessionError as exc:  # e.g. the database is unreachable or its schema is old
        sys.stderr.write(f"gateway {args.command}: {_typed(str(exc))}\n")
        return EXIT_UNREADABLE
    except KeyboardInterrupt:
        return 130


def _typed(message: str) -> str:
    """A failure's line with each `gateway ...` command it suggests (`gateway db upgrade`)
    spelled as the operator runs this one (``.venv/bin/gateway``): it works as printed."""
    return as_typed(message)


if __name__ == "__main__":
    raise SystemExit(main())

"""``gateway chat``: talk to the agent in the terminal, recorded like any other channel.

The gateway is built with only the console channel (its HTTP server on 127.0.0.1, port 0, for
``/healthz``); it runs until ``/quit`` or the end of input. Logs go to stderr at WARNING unless
``GATEWAY_LOG_LEVEL`` is set. Beside a gateway already running on the data directory it uses
its own, ``<data>/chat`` (:func:`beside_running`), and says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.commands.common import EXIT_USAGE, CommandError
from app.commands.run import load_settings

if TYPE_CHECKING:
    from app.config import Settings

DESCRIPTION = """\
Talk to the agent in this terminal, recorded like any other channel. Type /help for the chat
commands; /quit (or Ctrl-D) leaves. Logs stay quiet (WARNING) unless GATEWAY_LOG_LEVEL is set.
Beside a running gateway (`make run`) it keeps its sessions in <data dir>/chat, and says so."""


CHAT_DIR = "chat"
"""The data directory of a chat started beside a running gateway, inside the gateway's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversation", default="local", metavar="NAME",
                        help="conversation name (default: local); same name, same session")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions and the persona live (GATEWAY_DATA_DIR)")


async def run(args: argparse.Namespace) -> int:
    # Imported as the chat starts (see app.cli.SUBCOMMANDS).
    from app import logs
    from app.compose import build_gateway
    from app.compose_channels import console_channel
    from app.compose_providers import build_fallbacks
    from app.compose_store import build_store
    from app.compose_tools import tool_secrets
    from app.control import served
    from app.hints import replay_hint
    from app.provider_check import check_at_start
    from gateway.delivery.history import StoreHistory
    from gateway.edge.errors import ChannelError, ConfigError
    from gateway.edge.ids import InvalidIdError

    settings = load_settings(GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0,
                             GATEWAY_DATA_DIR=args.data_dir)
    if await served(settings.data_dir):
        settings = beside_running(settings)
    level = settings.log_level if "log_level" in settings.model_fields_set else "WARNING"
    logs.configure_from(settings, level, secrets=tool_secrets(settings))
    store = build_store(settings)
    try:
        console = console_channel(settings, StoreHistory(store), conversation=args.conversation,
                                  replay_command=replay_hint(settings.data_dir))
    except InvalidIdError as exc:
        await store.aclose()
        raise CommandError(str(exc), EXIT_USAGE) from exc
    try:
        fallbacks = build_fallbacks(settings)
        gateway = build_gateway(settings, store=store, channels=[console], fallbacks=fallbacks)
        check_at_start(gateway, fallbacks, offline_ok=settings.start_offline_ok)
    except ConfigError as exc:
        await store.aclose()
        raise CommandError(str(exc), EXIT_USAGE) from exc
    console.on_exit = gateway.request_stop
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # a reply must never crash an ASCII terminal
    try:
        await gateway.run_until_stopped()
    except (ConfigError, ChannelError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    return 0


def beside_running(settings: Settings) -> Settings:
    """The settings of a chat beside the gateway that runs on ``settings.data_dir``: one
    process owns a data directory (its journal of what it owes, its control socket), so the
    chat takes its own, ``<data>/chat``, keeping the operator's persona; it says so in one
    line on stderr (the replay hint then names that directory)."""
    own = settings.data_dir / CHAT_DIR
    sys.stderr.write(f"gateway chat: a gateway is running on {settings.data_dir}; this chat "
                     f"uses its own data directory, {own} (same persona, "
                     f"{settings.persona_root})\n")
    return load_settings(GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0, GATEWAY_DATA_DIR=own,
                         GATEWAY_PERSONA_DIR=settings.persona_root)

"""``gateway run``: serve the configured channels until SIGINT/SIGTERM.

Settings come from the environment and ``.env``; ``--host``, ``--port`` and ``--data-dir``
override them. A configuration problem is one line, ``gateway run: ...``, and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.commands.common import EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from app.config import Settings

DESCRIPTION = """\
Serve the channels named in GATEWAY_CHANNELS (web, telegram, slack) until Ctrl-C or SIGTERM,
with /healthz and /metrics on the same HTTP port. Settings come from the environment and .env
(config.example.env lists them all); the options below override three of them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (GATEWAY_HOST)")
    parser.add_argument("--port", type=int, default=None, help="port to bind (GATEWAY_PORT)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions and the persona live (GATEWAY_DATA_DIR)")


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and ``.env``; ``overrides`` (by variable name) win.

    ``None`` overrides are dropped. Settings are keyed by their environment variable names
    (``GATEWAY_PORT=...``): field names passed to ``Settings`` are ignored, not applied.
    """
    # Imported here, not above: settings (pydantic) and the composition root (every SDK) are
    # what running costs, and ``gateway --help`` imports this module without running it.
    from pydantic import ValidationError

    from app.config import Settings

    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise CommandError(f"invalid setting {where}: {first['msg']}", EXIT_USAGE) from exc


def shared_env_file(path: Path) -> str | None:
    """The warning for a settings file other users may read (it holds every key and token),
    or None when it is private or absent."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"{path} can be read by other users of this machine (mode {mode:04o}) and holds "
            f"the gateway's keys and tokens: chmod 600 {path}")


async def run(args: argparse.Namespace) -> int:
    from app import logs
    from app.compose import build_gateway
    from app.compose_providers import build_fallbacks
    from app.compose_tools import tool_secrets
    from app.provider_check import check_at_start
    from gateway.edge.errors import ChannelError, ConfigError
    from sessions.files import ensure_private_dir

    settings = load_settings(GATEWAY_HOST=args.host, GATEWAY_PORT=args.port,
                             GATEWAY_DATA_DIR=args.data_dir)
    logs.configure_from(settings, secrets=tool_secrets(settings))
    warning = await asyncio.to_thread(shared_env_file, Path(".env"))
    if warning is not None:
        logging.getLogger(__name__).warning("%s", warning)
    # Private whichever store keeps the sessions (the JSONL store tightens it itself; with
    # PostgreSQL the MCP logs, persona and owed journal live in it all the same).
    await asyncio.to_thread(ensure_private_dir, settings.data_dir)
    try:
        fallbacks = build_fallbacks(settings)
        gateway = build_gateway(settings, fallbacks=fallbacks)
        check_at_start(gateway, fallbacks, offline_ok=settings.start_offline_ok)
        await gateway.run_until_stopped()
    except (ConfigError, ChannelError) as exc:  # bad setting, busy port, token, platform down
        raise CommandError(str(exc), EXIT_USAGE) from exc
    return 0

"""``gateway viewer``: the session viewer as its own read-only server.

Serves the pages of the gateway's ``/admin`` from a data directory, with no channel, provider
or writer: it only lists and reads session logs. Bound to a loopback address (the default) it
needs no token; if ``GATEWAY_ADMIN_TOKEN`` is set it asks for it anyway. Bound anywhere else it
refuses to start without that token. ``--tenant T`` pins the viewer to tenant T (see
:mod:`app.admin.auth` for the tenancy rule). Runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app.commands.common import EXIT_USAGE, CommandError
from gateway.edge.hosts import TrustedProxies, is_loopback
from sessions.errors import InvalidNameError

if TYPE_CHECKING:
    from app.admin import Access, SessionSource
    from app.config import Settings
    from sessions.blobs import BlobStore

DEFAULT_PORT = 8788
DESCRIPTION = """\
Serve the session viewer (the pages of /admin) from the data directory, read-only: session
timelines, the exact requests, prompt diffs and drift charts. On a loopback address it needs no
token; anywhere else it refuses to start without GATEWAY_ADMIN_TOKEN."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the sessions live (GATEWAY_DATA_DIR)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; others need a token)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--tenant", default=None,
                        help="show only this tenant (default: the default tenant, switchable)")


def admin_token(settings: Settings) -> str | None:
    """``GATEWAY_ADMIN_TOKEN`` (empty counts as unset)."""
    token = settings.admin_token.get_secret_value() if settings.admin_token else ""
    return token or None


def access_for(host: str, token: str | None, tenant: str | None) -> Access:
    """The viewer's access rule; refuses a non-loopback bind without a token."""
    from app.admin import Access

    if token is None and not is_loopback(host):
        raise CommandError(
            f"--host {host} is not a loopback address and GATEWAY_ADMIN_TOKEN is not set; "
            "set a token to serve the viewer beyond this machine", EXIT_USAGE)
    try:
        return Access(token, pinned=tenant)
    except InvalidNameError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


async def run(args: argparse.Namespace, source: SessionSource, settings: Settings,
              out: TextIO | None = None, blobs: BlobStore | None = None) -> int:
    # The web server and the admin pages, imported when the viewer starts, not for --help.
    from aiohttp import web

    from app.admin import AdminSite
    from app.prices import load_prices
    from app.server_limits import plain_bodies
    from gateway.edge.errors import ConfigError

    out = out or sys.stdout
    data_dir = settings.data_dir
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port {args.port} is not a port number", EXIT_USAGE)
    access = access_for(args.host, admin_token(settings), args.tenant)
    if not await asyncio.to_thread(data_dir.is_dir):
        raise CommandError(f"no such data directory: {data_dir}", EXIT_USAGE)
    try:
        prices = load_prices(settings.prices_file)
    except ConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    app = AdminSite(source, access, prices=prices, blobs=blobs,
                    proxies=TrustedProxies.parse(settings.trusted_proxies)).application()
    app.middlewares.append(plain_bodies)  # as the gateway's server: no body is inflated
    runner = web.AppRunner(app, access_log=None, handle_signals=False, auto_decompress=False)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, args.host, args.port).start()
        except OSError as exc:
            raise CommandError(f"cannot listen on {args.host}:{args.port}: "
                               f"{exc.strerror or exc}", EXIT_USAGE) from exc
        port = runner.addresses[0][1]
        host = f"[{args.host}]" if ":" in args.host else args.host
        scope = f"tenant {access.pinned} only" if access.pinned else "default tenant"
        auth = "token required" if access.token else "no token (loopback only)"
        # The handlers first: whoever reads the line may stop the viewer at once.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        out.write(f"viewer on http://{host}:{port}/admin/  (read-only; {scope}; {auth})\n")
        out.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0

"""``gateway db upgrade|status``: the PostgreSQL session store's schema.

``upgrade`` applies pending migrations (safe to run from several workers at once: they queue on
an advisory lock, and a second run finds nothing to do) and prints the version. ``status``
prints the version and the applied migrations, changing nothing. The database is ``--url`` or
else ``GATEWAY_STORE_URL``; it is printed with its password masked, and connection errors never
show the URL. Exit 2 without a URL or with a bad ``--schema``, 1 when the database cannot be
reached or its schema is newer than this gateway.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.hints import as_typed
from sessions.postgres import schema as pg_schema

if TYPE_CHECKING:
    from app.config import Settings

URL_VARIABLE = "GATEWAY_STORE_URL"
DESCRIPTION = """\
The PostgreSQL session store's tables. "upgrade" creates them or applies pending migrations
(safe to run from several workers at once); "status" shows the version and changes nothing.
The database is --url or GATEWAY_STORE_URL (environment or .env); its password is never
printed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    upgrade = sub.add_parser("upgrade", prog="gateway db upgrade",
                             help="create the tables or apply pending migrations")
    status = sub.add_parser("status", prog="gateway db status",
                            help="show the schema version, change nothing")
    for p in (upgrade, status):
        p.add_argument("--url", default=None, help=f"postgresql:// URL (default: {URL_VARIABLE})")
        add_schema_argument(p)


def add_schema_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schema", default=None, type=_schema,
                        help="PostgreSQL schema (default: GATEWAY_STORE_SCHEMA, else "
                             f"{pg_schema.DEFAULT_SCHEMA})")


def _schema(value: str) -> str:
    try:
        return pg_schema.validate_schema(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def safe_error(exc: BaseException, url: str) -> str:
    """A one-line reason for ``exc`` that cannot leak ``url`` or the password in it."""
    from urllib.parse import unquote, urlsplit

    from sessions.postgres.store import redact_url

    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    secrets = [url]
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        secrets += [password, unquote(password)]
    for secret in secrets:
        text = text.replace(secret, redact_url(url) if secret == url else "***")
    return text


async def run(args: argparse.Namespace, settings: Settings, out: TextIO | None = None) -> int:
    """``settings`` carry ``--url`` and ``--schema`` already (see ``app.cli``)."""
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    import asyncpg

    from sessions.postgres.store import redact_url

    if settings.store_url is None:
        raise CommandError(f"no database: give --url or set {URL_VARIABLE}", EXIT_USAGE)
    url = settings.store_url.get_secret_value()
    schema = settings.store_schema
    where = f"{redact_url(url)} schema {schema}"
    try:
        conn = await asyncpg.connect(url, timeout=10)
    except (OSError, asyncpg.InterfaceError, asyncpg.PostgresError) as exc:
        raise CommandError(f"cannot connect to {redact_url(url)}: {safe_error(exc, url)}",
                           EXIT_UNREADABLE) from exc
    try:
        if args.db_action == "upgrade":
            before, after = await pg_schema.upgrade(conn, schema)
            done = "already up to date" if before == after else f"upgraded from {before}"
            out.write(f"{where}: version {after} ({done})\n")
            return EXIT_OK
        version = await pg_schema.current_version(conn, schema)
        if version == pg_schema.LATEST:
            state = "up to date"
        elif version < pg_schema.LATEST:
            state = as_typed("needs `gateway db upgrade`")
        else:
            state = "newer than this gateway"
        out.write(f"{where}: version {version} of {pg_schema.LATEST} ({state})\n")
        for number, description, applied_at in await pg_schema.applied(conn, schema):
            out.write(f"  {number:>3}  {applied_at.isoformat(timespec='seconds')}  {description}\n")
        return EXIT_OK
    except pg_schema.SchemaVersionError as exc:
        raise CommandError(str(exc), EXIT_UNREADABLE) from exc
    except (OSError, asyncpg.InterfaceError, asyncpg.PostgresError) as exc:
        raise CommandError(f"{where}: {safe_error(exc, url)}", EXIT_UNREADABLE) from exc
    finally:
        await conn.close()

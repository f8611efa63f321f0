"""``gateway pairing list|approve CODE|revoke CHANNEL:USER``: manage DM pairing.

Codes are shown only here, to the operator at the terminal; the gateway never logs them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app.commands.common import EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from app.config import Settings
    from gateway.edge.pairing import PairingStore

DESCRIPTION = """\
Someone not on an allowlist who writes to the bot in a DM gets a pairing code; approve the code
here and they may talk to the agent. With several workers (GATEWAY_REDIS_URL, from the
environment or .env) the codes and approvals live in their shared Redis."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data_dir_help = "where the pairing file lives without Redis (GATEWAY_DATA_DIR)"
    parser.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    # --data-dir is taken after the action too (`gateway pairing list --data-dir D`), as every
    # other command takes it after its words; there its default is "not given", so it never
    # undoes one given before the action.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS, help=data_dir_help)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="pending codes and approved people", parents=[after])
    approve = sub.add_parser("approve", help="approve the person who was given CODE",
                             parents=[after])
    approve.add_argument("code", help="the code the person received (e.g. K7QM2PXA)")
    revoke = sub.add_parser("revoke", help="remove an approved person (CHANNEL:USER)",
                            parents=[after])
    revoke.add_argument("who", metavar="CHANNEL:USER", help="e.g. telegram:12345")


def pairing_store(settings: Settings) -> PairingStore:
    """The file state, or the workers' shared Redis state when GATEWAY_REDIS_URL is set
    (so an approval reaches every worker)."""
    from app.compose_access import pairing_state
    from gateway.edge.pairing import PairingStore

    url = settings.redis_url.get_secret_value() if settings.redis_url is not None else None
    return PairingStore(pairing_state(settings.data_dir, url, settings.redis_prefix))


def run(args: argparse.Namespace, settings: Settings, out: TextIO | None = None) -> int:
    from gateway.edge.pairing import CODE_TTL, PairingError

    out = out or sys.stdout
    store = pairing_store(settings)
    try:
        if args.action == "approve":
            request = store.approve(args.code)
            who = f" ({request.name})" if request.name else ""
            out.write(f"approved {request.channel}:{request.user}{who}\n")
        elif args.action == "revoke":
            channel, _, user = args.who.partition(":")
            if not channel or not user:
                raise CommandError("revoke takes CHANNEL:USER, e.g. telegram:12345", EXIT_USAGE)
            store.revoke(channel, user)
            out.write(f"revoked {channel}:{user}\n")
        else:
            listing = store.listing()
            now = time.time()
            out.write("pending:\n")
            for code, p in sorted(listing["pending"].items(), key=lambda kv: kv[1]["created"]):
                left = int((CODE_TTL - (now - p["created"])) // 60)
                name = f" ({p['name']})" if p.get("name") else ""
                out.write(f"  {code}  {p['channel']}:{p['user']}{name}  expires in {left} min\n")
            out.write("approved:\n")
            for who, a in sorted(listing["approved"].items()):
                name = f" ({a['name']})" if a.get("name") else ""
                out.write(f"  {who}{name}\n")
            if listing["locked"]:
                out.write("approval is locked after too many bad codes\n")
    except PairingError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except ValueError as exc:
        raise CommandError(str(exc), 1) from exc
    return 0

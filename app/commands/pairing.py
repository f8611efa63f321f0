"""``gateway pairing list|approve CODE|revoke CHANNEL:USER``: manage DM pairing.

Codes are shown only here, to the operator at the terminal; the gateway never logs them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from app.commands.common import EXIT_USAGE, CommandError
from app.compose import pairing_state
from gateway.pairing import CODE_TTL, PairingError, PairingStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="pending codes and approved users")
    approve = sub.add_parser("approve", help="approve the person who was given CODE")
    approve.add_argument("code")
    revoke = sub.add_parser("revoke", help="remove an approved user (CHANNEL:USER)")
    revoke.add_argument("who", metavar="CHANNEL:USER")


def pairing_store(data_dir: Path) -> PairingStore:
    """The file state, or the workers' shared Redis state when GATEWAY_REDIS_URL is set
    (so an approval reaches every worker)."""
    return PairingStore(pairing_state(data_dir, os.environ.get("GATEWAY_REDIS_URL") or None,
                                      os.environ.get("GATEWAY_REDIS_PREFIX") or None))


def run(args: argparse.Namespace, data_dir: Path, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    store = pairing_store(data_dir)
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

"""``gateway prune [--dry-run] [--tenant T]``: apply the configured retention once.

The sessions whose last entry is older than their tenant's retention
(``GATEWAY_RETENTION_DAYS``, ``GATEWAY_RETENTION_TENANTS``: :mod:`sessions.retention`) go, in
whichever store the gateway uses (JSONL or PostgreSQL), then the attachment bytes no session
(nor rerun log) refers to any more; one line each and a summary. The running gateway does the
same every hour (:mod:`gateway.schedule.retention`); this is the same pass by hand (after a
policy change, say, or with the gateway stopped). Usage records (the budgets' daily totals)
expire by themselves. A session a running gateway holds open (JSONL) is kept, saying so.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, TextIO

from app.commands.common import EXIT_OK, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from app.config import Settings

DESCRIPTION = """\
Apply the retention of GATEWAY_RETENTION_DAYS (and GATEWAY_RETENTION_TENANTS) once: sessions
whose last entry is older go (either store), then the files no session refers to any more.
The running gateway does this every hour."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    parser.add_argument("--tenant", default=None, help="only this tenant (default: every one)")
    parser.add_argument("--data-dir", default=None, help="the data directory (GATEWAY_DATA_DIR)")


async def run(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """One pass (see the module docstring)."""
    from app import compose_store
    from app.commands.blob_prune import prune_blobs
    from sessions.errors import InvalidNameError
    from sessions.names import validate_tenant
    from sessions.retention import RetentionPolicy

    policy = settings.retention
    if args.tenant is not None:
        try:
            validate_tenant(args.tenant)
        except InvalidNameError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        policy = RetentionPolicy(None, {args.tenant: policy.days(args.tenant)})
    if not policy.any:
        out.write("retention keeps every session (GATEWAY_RETENTION_DAYS is 0): nothing to do\n")
        return EXIT_OK
    now = time.time()
    cutoffs = policy.cutoffs(now)
    store = compose_store.build_store(settings)
    reruns = compose_store.rerun_store(settings.data_dir)
    blobs = compose_store.blob_store_for(store, settings.data_dir)
    try:
        pruned = await store.prune(cutoffs, dry=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for item in pruned:
            label = f"{item.tenant}/{item.session_id}"
            if item.kept is not None:
                out.write(f"kept {label}: {item.kept}\n")
            else:
                out.write(f"{verb} {label}  {item.size_bytes} bytes  last modified "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(item.modified))}\n")
        gone = [p for p in pruned if p.kept is None]
        out.write(f"{verb} {len(gone)} session(s), {sum(p.size_bytes for p in gone)} bytes\n")
        tenants = [t for t in await blobs.tenants() if cutoffs(t) is not None]
        await prune_blobs([store, reruns], blobs, None, tenants=tenants, dry=args.dry_run,
                          out=out, now=now, gone=cutoffs)
    finally:
        await blobs.aclose()
        await reruns.aclose()
        await store.aclose()
    return EXIT_OK

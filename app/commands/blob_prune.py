"""Retention for attachment blobs: after ``gateway sessions prune`` (and in ``gateway
prune``), remove the blobs no session refers to any more (:func:`sessions.retention.
prune_blobs`), one line each and a summary.

A blob is removed only when no session of its tenant (sessions and rerun logs alike) refers
to it and it was stored more than an hour ago: a file that has just been stored belongs to a
message that is about to be recorded. With ``--dry-run`` nothing is removed; the blobs listed
are those the sessions that would be kept do not refer to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TextIO

from sessions.attachments import human_size
from sessions.blobs import BlobStore
from sessions.retention import prune_blobs as remove_unreferenced
from sessions.store import SessionStore


async def prune_blobs(stores: Sequence[SessionStore], blobs: BlobStore, tenant: str | None,
                      *, dry: bool, out: TextIO, older_than: float | None = None,
                      now: float | None = None,
                      gone: Callable[[str], float | None] | None = None,
                      tenants: Sequence[str] | None = None) -> int:
    """Remove (or, ``dry``, list) unreferenced blobs of ``tenant`` (None: every tenant, or
    ``tenants``) and write one summary line (none when there are no blobs at all); the
    number removed (or that would be). ``older_than``: with ``dry``, sessions last modified
    before it count as gone (they would be pruned); ``gone``: the same per tenant."""
    now = time.time() if now is None else now
    verb = "would remove" if dry else "removed"
    names = [tenant] if tenant is not None else tenants
    if gone is None and older_than is not None:
        cutoff = older_than

        def gone(_: str) -> float | None:
            return cutoff
    found = await remove_unreferenced(stores, blobs, names, now=now, dry=dry,
                                      gone=gone if dry else None)
    for name, blob in found.removed:
        out.write(f"{verb} blob {name}/{blob.hash}  {blob.size} bytes\n")
    if found.looked_at:
        out.write(f"{verb} {len(found.removed)} unreferenced blob(s), "
                  f"{human_size(sum(b.size for _, b in found.removed))}\n")
    return len(found.removed)

"""Retention for attachment blobs: after ``gateway sessions prune``, remove the blobs no session
refers to any more.

A blob is removed only when no session of its tenant (sessions and rerun logs alike) refers
to it and it was stored more than :data:`GRACE_SECONDS` ago: a file that has just been stored
belongs to a message that is about to be recorded. With ``--dry-run`` nothing is removed; the
blobs listed are those the sessions that would be kept do not refer to.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO

from sessions.attachments import human_size, referenced
from sessions.blobs import BlobStore
from sessions.errors import SessionNotFoundError
from sessions.store import SessionStore

GRACE_SECONDS = 3600
"""Blobs younger than this are kept whatever refers to them (an upload whose message is on
its way)."""


async def prune_blobs(stores: Sequence[SessionStore], blobs: BlobStore, tenant: str | None,
                      *, dry: bool, out: TextIO, older_than: float | None = None,
                      now: float | None = None) -> int:
    """Remove (or, ``dry``, list) unreferenced blobs of ``tenant`` (None: every tenant) and
    write one summary line (none when there are no blobs at all); the number removed (or that
    would be). ``older_than``: with ``dry``, sessions last modified before it count as gone
    (they would be pruned)."""
    now = time.time() if now is None else now
    verb = "would remove" if dry else "removed"
    count = total = 0
    seen = False
    tenants = [tenant] if tenant is not None else await blobs.tenants()
    for name in tenants:
        stored = await blobs.list_blobs(name)
        if not stored:
            continue
        seen = True
        wanted = await _referenced(stores, name, older_than if dry else None)
        stale = [b for b in stored
                 if b.hash not in wanted and now - b.stored_at > GRACE_SECONDS]
        if not stale:
            continue
        if not dry:
            await blobs.delete(name, [b.hash for b in stale])
        for blob in stale:
            out.write(f"{verb} blob {name}/{blob.hash}  {blob.size} bytes\n")
        count += len(stale)
        total += sum(b.size for b in stale)
    if seen:
        out.write(f"{verb} {count} unreferenced blob(s), {human_size(total)}\n")
    return count


async def _referenced(stores: Sequence[SessionStore], tenant: str,
                      older_than: float | None) -> set[str]:
    found: set[str] = set()
    for store in stores:
        for info in await store.list_sessions(tenant):
            if older_than is not None and info.modified < older_than:
                continue  # a dry run: this one would be pruned
            try:
                found |= referenced(await store.read_log(tenant, info.session_id))
            except SessionNotFoundError:
                continue  # pruned meanwhile
    return found

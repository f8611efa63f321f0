"""Retention: how long a tenant's session logs and files are kept, and removing what is older.

A :class:`RetentionPolicy` says, per tenant, how many days a session is kept after its last
entry (``GATEWAY_RETENTION_DAYS``, ``GATEWAY_RETENTION_TENANTS``; ``None``: forever). Each
store removes the sessions last modified before a tenant's cutoff
(:meth:`sessions.store.SessionStore.prune`), keeping one a live writer of another process
holds where it can tell; :func:`prune_blobs` then removes the attachment bytes no session
refers to any more. The running gateway applies the policy every hour
(:mod:`gateway.schedule.retention`), ``gateway prune`` once. Usage records (the ledger's daily
totals) expire by themselves, after the policy's days if sooner (:func:`keep_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sessions.attachments import referenced
from sessions.blobs import BlobInfo, BlobStore
from sessions.errors import SessionNotFoundError
from sessions.store import Cutoffs, SessionStore

DAY = 86_400.0
GRACE_SECONDS = 3600
"""Blobs younger than this are kept whatever refers to them (an upload whose message is on
its way)."""



@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Days a tenant's sessions are kept after their last entry (``None``: forever)."""

    default: float | None = None
    tenants: Mapping[str, float | None] = field(default_factory=dict)

    def days(self, tenant: str) -> float | None:
        return self.tenants.get(tenant, self.default)

    @property
    def any(self) -> bool:
        """Whether any tenant's sessions are ever removed."""
        return self.default is not None or any(d is not None for d in self.tenants.values())

    def cutoffs(self, now: float) -> Cutoffs:
        """Each tenant's cutoff at Unix time ``now``."""
        def at(days: float | None) -> float | None:
            return None if days is None else now - days * DAY
        return Cutoffs(at(self.default), {t: at(d) for t, d in self.tenants.items()})

    @classmethod
    def parse(cls, default: float, tenants: str) -> RetentionPolicy:
        """From the settings: ``default`` days (0: forever) and ``T1=30,T2=0`` (days per
        tenant, 0: forever). Raises ``ValueError`` naming what is wrong."""
        per: dict[str, float | None] = {}
        for part in (p.strip() for p in tenants.split(",") if p.strip()):
            name, sep, days = part.partition("=")
            try:
                value = float(days)
            except ValueError:
                value = -1.0
            if not sep or not name.strip() or value < 0:
                raise ValueError(f"{part!r}: give tenant=days (days >= 0; 0 keeps forever)")
            per[name.strip()] = value or None
        if default < 0:
            raise ValueError("days >= 0 (0 keeps forever)")
        return cls(default or None, per)


def keep_seconds(policy: RetentionPolicy, tenant: str, longest: float) -> float:
    """How long a record of ``tenant`` that is kept ``longest`` seconds at most may be kept
    under ``policy`` (the shorter of the two)."""
    days = policy.days(tenant)
    return longest if days is None else min(longest, days * DAY)


@dataclass(frozen=True, slots=True)
class BlobsPruned:
    """What :func:`prune_blobs` found: how many blobs it looked at, and those it removed."""

    looked_at: int
    removed: list[tuple[str, BlobInfo]]


async def prune_blobs(stores: Sequence[SessionStore], blobs: BlobStore,
                      tenants: Sequence[str] | None, *, now: float, dry: bool = False,
                      gone: Callable[[str], float | None] | None = None) -> BlobsPruned:
    """Remove (``dry``: only list) the blobs of ``tenants`` (``None``: every tenant) that no
    session of any of ``stores`` refers to and that were stored more than
    :data:`GRACE_SECONDS` before ``now``. ``gone``: sessions last modified before their
    tenant's cutoff count as removed already (a dry run of retention)."""
    removed: list[tuple[str, BlobInfo]] = []
    looked_at = 0
    for name in tenants if tenants is not None else await blobs.tenants():
        stored = await blobs.list_blobs(name)
        if not stored:
            continue
        looked_at += len(stored)
        wanted = await _referenced(stores, name, gone(name) if gone is not None else None)
        stale = [b for b in stored if b.hash not in wanted and now - b.stored_at > GRACE_SECONDS]
        if stale and not dry:
            await blobs.delete(name, [b.hash for b in stale])
        removed.extend((name, b) for b in stale)
    return BlobsPruned(looked_at, removed)


async def _referenced(stores: Sequence[SessionStore], tenant: str,
                      before: float | None) -> set[str]:
    found: set[str] = set()
    for store in stores:
        for info in await store.list_sessions(tenant):
            if before is not None and info.modified < before:
                continue  # would be removed
            try:
                found |= referenced(await store.read_log(tenant, info.session_id))
            except SessionNotFoundError:
                continue  # removed meanwhile
    return found

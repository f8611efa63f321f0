"""The blob store seam: attachment bytes, content-addressed by sha256, per tenant.

A message entry refers to an attachment by the sha256 of its bytes (:mod:`sessions.attachments`);
the bytes live here, once per tenant however often they are sent. Backends: a folder of files
beside the JSONL sessions (:mod:`sessions.blob_files`) and a PostgreSQL table
(:mod:`sessions.postgres.blobs`); the composition root picks the one that matches the session
store, so a log and the blobs it refers to always live together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sessions.attachments import HASH_PATTERN, BlobRef
from sessions.errors import BlobCorruptError, InvalidNameError


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One stored blob: its hash, size and when it was stored (epoch seconds)."""

    hash: str
    size: int
    stored_at: float


def digest_of(data: bytes) -> str:
    """The content address of ``data``: lowercase hex sha256 (64 characters)."""
    return hashlib.sha256(data).hexdigest()


def checked(digest: str, data: bytes) -> bytes:
    """``data`` when it is the blob ``digest`` names; :class:`BlobCorruptError` (naming both
    hashes) when it is not. Every backend passes every blob it reads through this one check
    before anyone sees the bytes (in a worker thread: a 20 MB sha256 must not stall the
    loop)."""
    actual = digest_of(data)
    if actual != digest:
        raise BlobCorruptError(digest, actual)
    return data


def validate_digest(digest: object) -> str:
    """A blob hash is 64 lowercase hex characters; anything else is refused before any use."""
    if not isinstance(digest, str) or HASH_PATTERN.fullmatch(digest) is None:
        raise InvalidNameError("a blob hash is 64 lowercase hex characters")
    return digest


class BlobStore(Protocol):
    """Attachment bytes by content address.

    Contract: :meth:`put` stores ``data`` under ``sha256(data)`` for ``tenant`` and returns the
    hash; putting the same bytes again stores nothing new. It returns only once the bytes are as
    durable as the store's session logs are (so a message entry that refers to them is never
    more durable than they are), and leaves nothing half-written under a blob's name when it
    fails (:class:`~sessions.errors.BlobWriteError`). :meth:`get` returns exactly the bytes
    stored or raises :class:`~sessions.errors.BlobMissingError`; :meth:`get_many` returns those
    it has and leaves the absent ones out. Every read passes the bytes through
    :func:`checked`: bytes that do not hash to their name are never returned, by either
    method, but refused with :class:`~sessions.errors.BlobCorruptError` naming the hash (a
    damaged blob is not an absent one: the caller must not carry on as if it were). Tenants
    never see each other's blobs. Hashes and tenants are validated before any use. :meth:`aclose` is
    idempotent.
    """

    async def put(self, tenant: str, data: bytes) -> str: ...

    async def get(self, tenant: str, digest: str) -> bytes: ...

    async def get_many(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]: ...

    async def list_blobs(self, tenant: str) -> list[BlobInfo]:
        """Every blob of ``tenant`` (for retention), in no particular order."""
        ...

    async def delete(self, tenant: str, digests: Iterable[str]) -> int:
        """Remove these blobs (absent ones are skipped); the number removed."""
        ...

    async def tenants(self) -> list[str]:
        """Tenants that have blobs (for retention over every tenant)."""
        ...

    async def aclose(self) -> None: ...


async def load(store: BlobStore, tenant: str, refs: Iterable[BlobRef]) -> dict[str, bytes]:
    """The bytes of ``refs`` that ``store`` holds (hash -> bytes); missing ones are left out,
    for the request shapes to report by name. Raises
    :class:`~sessions.errors.BlobCorruptError` for a damaged one."""
    wanted = list(dict.fromkeys(ref.hash for ref in refs))
    if not wanted:
        return {}
    return await store.get_many(tenant, wanted)


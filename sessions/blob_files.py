"""The embedded blob store: one file per blob, beside the JSONL sessions.

Layout (the sessions layout, with ``blobs/`` for ``sessions/``)::

    <data_dir>/blobs/<hh>/<sha256>                      tenant "default"
    <data_dir>/tenants/<tenant>/blobs/<hh>/<sha256>     any other tenant

``hh`` is the hash's first two hex digits (a few hundred files per folder, not millions in one).
Files are 0600, folders 0700. A blob is written under a temporary name in its folder, synced
(unless the store's durability is ``none``), then renamed into place and the folder synced, so
a blob's name only ever holds its whole content; a failed write leaves nothing behind. Reads
check the bytes against their hash (:func:`sessions.blobs.checked`, as every backend does).
All file work runs in a worker thread: a 20 MB write must not stall the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from sessions.blobs import BlobInfo, checked, digest_of, validate_digest
from sessions.errors import BlobCorruptError, BlobMissingError, BlobWriteError
from sessions.files import FILE_MODE, ensure_private_dir, sync_dir, write_all
from sessions.names import DEFAULT_TENANT, validate_tenant

FOLDER = "blobs"


class FileBlobStore:
    """Blobs as files under ``data_dir``. See :class:`sessions.blobs.BlobStore`."""

    def __init__(self, data_dir: Path | str, *, durable: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.durable = durable
        # Shard folders already made private by this store: checked once, not on every put.
        self._ready: set[Path] = set()

    def tenant_dir(self, tenant: str) -> Path:
        validate_tenant(tenant)
        if tenant == DEFAULT_TENANT:
            return self.data_dir / FOLDER
        return self.data_dir / "tenants" / tenant / FOLDER

    def path_of(self, tenant: str, digest: str) -> Path:
        validate_digest(digest)
        return self.tenant_dir(tenant) / digest[:2] / digest

    # -- writing ---------------------------------------------------------------------------

    async def put(self, tenant: str, data: bytes) -> str:
        validate_tenant(tenant)
        return await asyncio.to_thread(self._put, tenant, data)

    def _put(self, tenant: str, data: bytes) -> str:
        digest = digest_of(data)
        path = self.path_of(tenant, digest)
        try:
            if path.stat().st_size == len(data):
                return digest  # content-addressed: the same bytes are already there
        except FileNotFoundError:
            pass
        try:
            folder = self._private_dir(tenant, digest)
            temporary = folder / f".{digest}.{secrets.token_hex(4)}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except OSError as exc:
            raise BlobWriteError(_kind(exc), "create") from exc
        try:
            try:
                write_all(fd, data)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
            if self.durable:
                sync_dir(folder)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise BlobWriteError(_kind(exc)) from exc
        return digest

    def _private_dir(self, tenant: str, digest: str) -> Path:
        shard = self.tenant_dir(tenant) / digest[:2]
        if shard in self._ready and shard.is_dir():
            return shard
        ensure_private_dir(self.data_dir)
        if tenant != DEFAULT_TENANT:
            ensure_private_dir(self.data_dir / "tenants")
            ensure_private_dir(self.data_dir / "tenants" / tenant)
        ensure_private_dir(self.tenant_dir(tenant))
        self._ready.add(ensure_private_dir(shard))
        return shard

    # -- reading ---------------------------------------------------------------------------

    async def get(self, tenant: str, digest: str) -> bytes:
        path = self.path_of(tenant, digest)
        return await asyncio.to_thread(_read_checked, path, digest)

    async def get_many(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]:
        paths = {digest: self.path_of(tenant, digest) for digest in digests}
        return await asyncio.to_thread(_read_many, paths)

    async def list_blobs(self, tenant: str) -> list[BlobInfo]:
        root = self.tenant_dir(tenant)
        return await asyncio.to_thread(_scan, root)

    async def delete(self, tenant: str, digests: Iterable[str]) -> int:
        paths = [self.path_of(tenant, digest) for digest in digests]
        return await asyncio.to_thread(_unlink_all, paths)

    async def tenants(self) -> list[str]:
        found = [DEFAULT_TENANT] if (self.data_dir / FOLDER).is_dir() else []
        root = self.data_dir / "tenants"
        if root.is_dir():
            found.extend(sorted(p.name for p in root.iterdir() if (p / FOLDER).is_dir()))
        return found

    async def aclose(self) -> None:
        return None


def _kind(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _read_checked(path: Path, digest: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BlobMissingError(digest, "no such blob") from None
    except OSError as exc:
        raise BlobMissingError(digest, f"it could not be read ({_kind(exc)})") from exc
    return checked(digest, data)


def _read_many(paths: dict[str, Path]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for digest, path in paths.items():
        try:
            found[digest] = _read_checked(path, digest)
        except BlobCorruptError:
            raise
        except BlobMissingError:
            continue
    return found


def _scan(root: Path) -> list[BlobInfo]:
    infos: list[BlobInfo] = []
    if not root.is_dir():
        return infos
    for folder in root.iterdir():
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in folder.iterdir():
            try:
                validate_digest(path.name)
            except ValueError:
                continue  # temporary files and strays are not blobs
            st = path.lstat()
            if path.is_symlink():
                continue
            infos.append(BlobInfo(path.name, st.st_size, st.st_mtime))
    return infos


def _unlink_all(paths: list[Path]) -> int:
    removed = 0
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed += 1
    return removed


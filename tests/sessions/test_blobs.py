"""The BlobStore contract, run against every backend (files beside the JSONL logs, PostgreSQL)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessions.attachments import BlobRef
from sessions.blob_files import FileBlobStore
from sessions.blobs import BlobStore, checked, load
from sessions.errors import (
    BlobCorruptError,
    BlobMissingError,
    BlobWriteError,
    InvalidNameError,
)
from sessions.postgres.blobs import PostgresBlobStore
from sessions.postgres.store import PostgresSessionStore

BACKENDS = ["files", pytest.param("postgres", marks=pytest.mark.services)]
PHOTO = os.urandom(300_000)
OTHER = b"another blob"


@pytest.fixture
async def pg_blobs(pg_store: PostgresSessionStore) -> AsyncIterator[PostgresBlobStore]:
    blobs = PostgresBlobStore(pg_store)
    yield blobs
    await blobs.aclose()


@pytest.fixture(params=BACKENDS)
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "files":
        return FileBlobStore(tmp_path / "data")
    found: BlobStore = request.getfixturevalue("pg_blobs")
    return found


async def test_put_is_content_addressed_and_idempotent(blobs: BlobStore) -> None:
    """The same bytes twice are stored once, under their sha256, and read back exactly."""
    first = await blobs.put("default", PHOTO)
    second = await blobs.put("default", PHOTO)
    assert first == second == hashlib.sha256(PHOTO).hexdigest()
    assert await blobs.get("default", first) == PHOTO
    assert [(b.hash, b.size) for b in await blobs.list_blobs("default")] == [(first, len(PHOTO))]


async def test_tenants_never_see_each_others_blobs(blobs: BlobStore) -> None:
    """A blob stored for one tenant is missing for another, even by its exact hash."""
    digest = await blobs.put("T1", OTHER)
    with pytest.raises(BlobMissingError):
        await blobs.get("T2", digest)
    assert await blobs.get_many("T2", [digest]) == {}
    assert await blobs.tenants() == ["T1"]


async def test_get_many_and_load_leave_missing_ones_out(blobs: BlobStore) -> None:
    """Bulk reads return what is there; the shapes then name what is not."""
    have = await blobs.put("default", OTHER)
    absent = hashlib.sha256(b"never stored").hexdigest()
    assert await blobs.get_many("default", [have, absent]) == {have: OTHER}
    refs = [BlobRef(have, "a.txt", "text/plain", len(OTHER)),
            BlobRef(absent, "b.txt", "text/plain", 1), BlobRef(have, "a.txt", "text/plain", 12)]
    assert await load(blobs, "default", refs) == {have: OTHER}
    assert await load(blobs, "default", []) == {}


async def test_delete_removes_only_what_it_names(blobs: BlobStore) -> None:
    """Deleting counts what it removed; other blobs stay readable."""
    keep = await blobs.put("default", PHOTO)
    drop = await blobs.put("default", OTHER)
    assert await blobs.delete("default", [drop, hashlib.sha256(b"x").hexdigest()]) == 1
    assert await blobs.delete("default", []) == 0
    assert await blobs.get_many("default", [keep, drop]) == {keep: PHOTO}


@pytest.mark.parametrize("bad", ["..", "a/b", "", "x" * 200])
async def test_bad_tenants_and_hashes_are_refused(blobs: BlobStore, bad: str) -> None:
    """Names are validated before any use: no path or query is ever built from them."""
    with pytest.raises(InvalidNameError):
        await blobs.put(bad, OTHER)
    with pytest.raises(InvalidNameError):
        await blobs.get("default", bad or "../../etc/passwd")
    with pytest.raises(InvalidNameError):
        await blobs.get("default", "A" * 64)  # upper case is not how hashes are written


async def test_file_blobs_are_private_and_sharded(tmp_path: Path) -> None:
    """Files 0600 in 0700 folders, under blobs/<hh>/<hash> (tenants/<t>/blobs/ for others)."""
    store = FileBlobStore(tmp_path / "data")
    digest = await store.put("default", PHOTO)
    other = await store.put("T9", OTHER)
    path = tmp_path / "data" / "blobs" / digest[:2] / digest
    tenant_path = tmp_path / "data" / "tenants" / "T9" / "blobs" / other[:2] / other
    assert path.read_bytes() == PHOTO
    assert tenant_path.read_bytes() == OTHER
    for file in (path, tenant_path):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        for folder in file.parents:
            if folder == tmp_path:
                break
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert await store.tenants() == ["default", "T9"]


async def damage(blobs: BlobStore, tenant: str, digest: str, data: bytes) -> None:
    """Replace the stored bytes of a blob behind the store's back (disk or database damage)."""
    if isinstance(blobs, FileBlobStore):
        blobs.path_of(tenant, digest).write_bytes(data)
        return
    assert isinstance(blobs, PostgresBlobStore)
    pool = await blobs.store.pool()
    async with pool.acquire() as conn:
        changed = await conn.execute(
            f"UPDATE {blobs.store.quoted_schema}.blobs SET data = $3, size = $4"
            " WHERE tenant = $1 AND hash = $2", tenant, digest, data, len(data))
    assert changed == "UPDATE 1"


async def test_a_damaged_blob_is_refused_with_its_hash_named(blobs: BlobStore) -> None:
    """Bytes that no longer hash to their name are never served as the blob, by any read:
    get, get_many and load refuse them with BlobCorruptError naming the hash and what the
    bytes hash to (a damaged blob is not an absent one); the right bytes put again repair it."""
    digest = await blobs.put("default", OTHER)
    keep = await blobs.put("default", PHOTO)
    await damage(blobs, "default", digest, b"tampered")
    actual = hashlib.sha256(b"tampered").hexdigest()
    message = (f"blob sha256 {digest} is damaged in the blob store (its stored bytes hash to "
               f"{actual}; refused)")
    for read in (blobs.get("default", digest), blobs.get_many("default", [keep, digest]),
                 load(blobs, "default", [BlobRef(digest, "a.txt", "text/plain", 8)])):
        with pytest.raises(BlobCorruptError) as refused:
            await read
        assert str(refused.value) == message
        assert (refused.value.digest, refused.value.actual) == (digest, actual)
    assert await blobs.get_many("default", [keep]) == {keep: PHOTO}
    assert await blobs.put("default", OTHER) == digest
    assert await blobs.get("default", digest) == OTHER


def test_the_shared_check() -> None:
    """The check every store's reads go through: the bytes when they hash to the name, else
    refused naming the hash."""
    digest = hashlib.sha256(OTHER).hexdigest()
    assert checked(digest, OTHER) is OTHER
    with pytest.raises(BlobCorruptError, match=digest):
        checked(digest, b"other bytes")


async def test_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    """A write that fails at the final rename: BlobWriteError with an errno kind, and neither
    the blob nor its temporary file is left (the blob's name never holds part of it)."""
    store = FileBlobStore(tmp_path / "data")
    digest = hashlib.sha256(PHOTO).hexdigest()
    blocker = store.path_of("default", digest)
    (blocker / "occupied").mkdir(parents=True)  # a non-empty folder where the file would go
    with pytest.raises(BlobWriteError) as caught:
        await store.put("default", PHOTO)
    assert caught.value.kind in {"EISDIR", "ENOTEMPTY", "EEXIST"}
    assert sorted(p.name for p in blocker.parent.iterdir()) == [digest]  # no .tmp left
    with pytest.raises(BlobMissingError):
        await store.get("default", digest)

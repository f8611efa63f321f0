"""``gateway sessions prune`` removes the attachment blobs no session refers to any more
(after the sessions it prunes), keeping those still referenced and those just stored."""

from __future__ import annotations

import asyncio
import io
import os
import time
from contextlib import redirect_stdout
from pathlib import Path

from app.cli import main
from sessions.attachments import BlobRef, ref_block
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from tests.sessions.helpers import add

DAY = 86_400
OLD = b"old photo bytes"
KEPT = b"photo still in a live session"
SHARED = b"in both sessions"
FRESH = b"just uploaded"


async def _setup(data_dir: Path) -> dict[bytes, str]:
    """An old session (OLD, SHARED) and a new one (KEPT, SHARED); FRESH is in no session but
    was stored a moment ago. Every other blob is two days old."""
    blobs = FileBlobStore(data_dir)
    digests = {data: await blobs.put("default", data) for data in (OLD, KEPT, SHARED, FRESH)}
    store = JsonlSessionStore(data_dir, durability="none")
    for session_id, files in (("old", (OLD, SHARED)), ("new", (KEPT, SHARED))):
        writer = await store.create(channel="web", conversation=session_id,
                                    session_id=session_id)
        await add(writer, {"role": "user", "content": [
            ref_block(BlobRef(digests[d], "f.bin", "image/png", len(d))) for d in files]})
        await writer.aclose()
    two_days_ago = time.time() - 2 * DAY
    os.utime(store.path_of("default", "old"), (two_days_ago, two_days_ago))
    for data in (OLD, KEPT, SHARED):
        path = blobs.path_of("default", digests[data])
        os.utime(path, (two_days_ago, two_days_ago))
    return digests


def prune(data_dir: Path, *extra: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["sessions", "prune", "--older-than", "1d", "--data-dir", str(data_dir),
                     *extra]) == 0
    return out.getvalue()


def remaining(data_dir: Path, digests: dict[bytes, str]) -> set[bytes]:
    store = FileBlobStore(data_dir)
    return {data for data, digest in digests.items()
            if store.path_of("default", digest).exists()}


def test_prune_removes_only_unreferenced_old_blobs(tmp_path: Path) -> None:
    """The pruned session's own blob goes; the shared one, the live one and the fresh
    unreferenced one stay."""
    digests = asyncio.run(_setup(tmp_path))
    dry = prune(tmp_path, "--dry-run")
    assert f"would remove blob default/{digests[OLD]}" in dry
    assert dry.splitlines()[-1] == f"would remove 1 unreferenced blob(s), {len(OLD)} bytes"
    assert remaining(tmp_path, digests) == {OLD, KEPT, SHARED, FRESH}
    done = prune(tmp_path)
    assert done.splitlines()[-1] == f"removed 1 unreferenced blob(s), {len(OLD)} bytes"
    assert remaining(tmp_path, digests) == {KEPT, SHARED, FRESH}
    assert prune(tmp_path).splitlines()[-1] == "removed 0 unreferenced blob(s), 0 bytes"

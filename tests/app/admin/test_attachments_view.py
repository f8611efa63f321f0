"""Attachments in the viewer: thumbnails and chips in the timeline, blobs served only to an
authorized admin and only for a session that refers to them, bodies with base64 elided."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sessions.attachments import BlobRef, ref_block
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from tests.app.admin.helpers import TOKEN, serve, site_for
from tests.fakes import media
from tests.sessions.helpers import PROMPT_A, add, assistant, call_request

PHOTO = media.jpeg(60, 40)
NOTES = b"# notes\n"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def session_with_files(data_dir: Path, *, tenant: str = "default") -> tuple[str, str]:
    """One call whose message carries a photo and a markdown file; their hashes."""
    blobs = FileBlobStore(data_dir)
    photo = BlobRef(await blobs.put(tenant, PHOTO), "cat.jpg", "image/jpeg", len(PHOTO))
    notes = BlobRef(await blobs.put(tenant, NOTES), "notes.md", "text/markdown", len(NOTES))
    store = JsonlSessionStore(data_dir, durability="none")
    writer = await store.create(tenant=tenant, channel="web", conversation="c",
                                session_id="s1")
    await add(writer, {"role": "user", "content": [
        ref_block(photo), ref_block(notes), {"type": "text", "text": "look"}]})
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await add(writer, assistant("A cat."))
    await writer.aclose()
    return photo.hash, notes.hash


async def test_timeline_shows_a_thumbnail_and_a_chip_served_to_the_admin(
    tmp_path: Path
) -> None:
    """The session page links a thumbnail of the photo and a chip of the file; both links
    serve the stored bytes (the image inline, the file as a download), sandboxed."""
    photo, notes = await session_with_files(tmp_path)
    site = site_for(tmp_path, TOKEN, blobs=FileBlobStore(tmp_path))
    async with serve(site) as viewer:
        status, page = await viewer.get("/admin/session/s1", headers=BEARER)
        assert status == 200
        assert f'<img src="/admin/session/s1/blob/{photo}" alt="cat.jpg"' in page
        assert f'href="/admin/session/s1/blob/{notes}" download="notes.md"' in page
        async with viewer.client.get(f"{viewer.base}/admin/session/s1/blob/{photo}",
                                     headers=BEARER) as response:
            assert (response.status, await response.read()) == (200, PHOTO)
            assert response.headers["Content-Type"] == "image/jpeg"
            assert "sandbox" in response.headers["Content-Security-Policy"]
        async with viewer.client.get(f"{viewer.base}/admin/session/s1/blob/{notes}",
                                     headers=BEARER) as response:
            assert (response.status, await response.read()) == (200, NOTES)
            assert response.headers["Content-Type"] == "application/octet-stream"
            assert response.headers["Content-Disposition"].startswith("attachment;")


async def test_blobs_need_an_admin_and_a_session_that_refers_to_them(tmp_path: Path) -> None:
    """No token: the login page, never the bytes. A hash the session does not refer to, even
    one in the blob store, is a 404; so is a malformed hash (400)."""
    photo, _ = await session_with_files(tmp_path)
    stray = await FileBlobStore(tmp_path).put("default", b"someone else's file")
    site = site_for(tmp_path, TOKEN, blobs=FileBlobStore(tmp_path))
    async with serve(site) as viewer:
        async with viewer.client.get(f"{viewer.base}/admin/session/s1/blob/{photo}") as resp:
            assert resp.status == 401
            assert PHOTO not in await resp.read()
        status, _ = await viewer.get(f"/admin/session/s1/blob/{stray}", headers=BEARER)
        assert status == 404
        status, _ = await viewer.get("/admin/session/s1/blob/zz..", headers=BEARER)
        assert status == 400


async def test_call_page_shows_the_exact_body_with_base64_elided(tmp_path: Path) -> None:
    """The call page rebuilds the body from the blobs and shows it without the megabytes; a
    deleted blob makes the body 'not rebuildable', named by hash, not a crash."""
    photo, notes = await session_with_files(tmp_path)
    blobs = FileBlobStore(tmp_path)
    site = site_for(tmp_path, TOKEN, blobs=blobs)
    async with serve(site) as viewer:
        status, page = await viewer.get("/admin/session/s1/call/1", headers=BEARER)
        assert status == 200
        assert "attachment bytes elided" in page
        assert "characters of base64, elided here" in page
        assert hashlib.sha256(PHOTO).hexdigest() == photo
        await blobs.delete("default", [notes])
        status, page = await viewer.get("/admin/session/s1/call/1", headers=BEARER)
        assert status == 200
        assert f"blob sha256 {notes} is not in the blob store" in page


async def test_a_damaged_blob_is_refused_on_the_call_page_and_as_a_file(tmp_path: Path) -> None:
    """Bytes that no longer hash to their name are never shown: the call page offers no body
    and names the damaged hash; the file link answers 422, without the bytes."""
    photo, _ = await session_with_files(tmp_path)
    blobs = FileBlobStore(tmp_path)
    blobs.path_of("default", photo).write_bytes(b"damaged bytes")
    site = site_for(tmp_path, TOKEN, blobs=blobs)
    async with serve(site) as viewer:
        status, page = await viewer.get("/admin/session/s1/call/1", headers=BEARER)
        assert status == 200
        assert f"No request body: blob sha256 {photo} is damaged in the blob store" in page
        assert "Request body as rebuilt by replay" not in page
        async with viewer.client.get(f"{viewer.base}/admin/session/s1/blob/{photo}",
                                     headers=BEARER) as response:
            assert response.status == 422
            assert b"damaged bytes" not in await response.read()

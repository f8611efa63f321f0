"""``gateway replay`` with attachments: request bodies rebuilt from the blob store (image
included), attachments named in turns, and a missing blob reported honestly."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import orjson
import pytest

from app.cli import main
from sessions.attachments import BlobRef, ref_block
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from sessions.shapes import SHAPES, request_body
from tests.fakes import media
from tests.sessions.helpers import PROMPT_A, add, assistant, call_request

PHOTO = media.jpeg(40, 30)


async def _session(data_dir: Path, tenant: str) -> tuple[str, dict[str, dict[str, object]]]:
    """One call whose user message carries a photo and a voice note; the live bodies."""
    blobs = FileBlobStore(data_dir)
    photo = BlobRef(await blobs.put(tenant, PHOTO), "cat.jpg", "image/jpeg", len(PHOTO))
    voice = BlobRef(await blobs.put(tenant, media.OGG_VOICE), "voice.ogg", "audio/ogg",
                    len(media.OGG_VOICE))
    message = {"role": "user", "content": [ref_block(photo),
                                           ref_block(voice, transcript="call me back"),
                                           {"type": "text", "text": "who is this?"}]}
    store = JsonlSessionStore(data_dir, durability="none")
    writer = await store.create(tenant=tenant, channel="telegram", conversation="c",
                                session_id="s1")
    await add(writer, message)
    request = call_request(PROMPT_A, ((0, 1),))
    await persist_call(writer, request)
    await add(writer, assistant("A cat."))
    await writer.aclose()
    loaded = {photo.hash: PHOTO, voice.hash: media.OGG_VOICE}
    live = {shape: request_body(shape, request.prompt.text, [message], request.tools,
                                request.model, request.params, blobs=loaded) for shape in SHAPES}
    return photo.hash, live


def cli(data_dir: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["replay", "--data-dir", str(data_dir), *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("tenant", ["default", "T1"])
def test_request_rebuilds_the_image_from_the_blob_store(tmp_path: Path, tenant: str) -> None:
    """--request N equals the body built live, for both shapes, the photo's bytes included."""
    _digest, live = asyncio.run(_session(tmp_path, tenant))
    for shape in SHAPES:
        code, out, err = cli(tmp_path, "s1", "--tenant", tenant, "--request", "1",
                             "--shape", shape)
        assert (code, err) == (0, "")
        assert orjson.loads(out) == live[shape]
    assert base64.b64encode(PHOTO).decode() in cli(tmp_path, "s1", "--tenant", tenant,
                                                   "--request", "1")[1]


def test_turn_names_attachments(tmp_path: Path) -> None:
    """--turn N names each attachment (name, type, size, hash) and shows the transcript."""
    digest, _ = asyncio.run(_session(tmp_path, "default"))
    code, out, _ = cli(tmp_path, "s1", "--turn", "1")
    assert code == 0
    size = f"{len(PHOTO) / 1024:.1f} KB" if len(PHOTO) >= 1024 else f"{len(PHOTO)} bytes"
    assert f"<attachment cat.jpg image/jpeg {size} sha256:{digest}>" in out
    assert "<attachment voice.ogg audio/ogg" in out
    assert "transcript: call me back" in out


def test_missing_blob_is_reported_not_invented(tmp_path: Path) -> None:
    """A deleted blob: --request exits 1 with one line naming the turn and the hash, no body."""
    digest, _ = asyncio.run(_session(tmp_path, "default"))
    asyncio.run(FileBlobStore(tmp_path).delete("default", [digest]))
    code, out, err = cli(tmp_path, "s1", "--request", "1")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert err.startswith("gateway replay: session s1: line 8: call 1 cannot be rebuilt: "
                          f"recorded but not rebuildable (blob sha256 {digest} is not in the "
                          "blob store: cat.jpg, image/jpeg, ")


def test_damaged_blob_is_refused_not_served(tmp_path: Path) -> None:
    """A blob whose bytes no longer hash to its name: --request exits 1 with one line naming
    the call, the hash and what the bytes hash to; no body is printed."""
    digest, _ = asyncio.run(_session(tmp_path, "default"))
    FileBlobStore(tmp_path).path_of("default", digest).write_bytes(b"not the photo")
    code, out, err = cli(tmp_path, "s1", "--request", "1")
    assert (code, out) == (1, "")
    actual = hashlib.sha256(b"not the photo").hexdigest()
    assert err == (f"gateway replay: session s1: call 1 cannot be rebuilt: blob sha256 {digest} "
                   f"is damaged in the blob store (its stored bytes hash to {actual}; refused)\n")


def export(data_dir: Path, fmt: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["export", "s1", "--format", fmt, "--content", "full",
                     "--data-dir", str(data_dir)]) == 0
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["otlp-json", "jsonl"])
def test_export_refers_to_blobs_by_hash(tmp_path: Path, fmt: str) -> None:
    """Exported records, with their content, name each attachment by its hash and never
    carry its bytes."""
    digest, _ = asyncio.run(_session(tmp_path, "default"))
    text = export(tmp_path, fmt)
    assert digest in text
    assert base64.b64encode(PHOTO).decode()[:40] not in text
    if fmt == "otlp-json":
        assert f'\\"file_id\\":\\"sha256:{digest}\\"' in text  # a GenAI file part, by hash

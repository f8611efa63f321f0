"""Attachment references in messages and their expansion into both request shapes."""

from __future__ import annotations

import base64
import hashlib

import orjson
import pytest

from sessions.attachments import (
    BlobRef,
    category,
    expand_anthropic,
    human_size,
    needed,
    ref_block,
    ref_of,
    referenced,
)
from sessions.errors import BlobMissingError, SessionReadError
from sessions.shapes import TOOL_FILES_INTRO, anthropic_body, openai_body, request_body

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 10
PDF = b"%PDF-1.4\n" + b"pages" * 10
NOTES = b"# Notes\nbuy \"tea\"\n"
OGG = b"OggS" + b"\x00" * 40


def ref(data: bytes, name: str, media_type: str) -> BlobRef:
    return BlobRef(hashlib.sha256(data).hexdigest(), name, media_type, len(data))


IMG = ref(PNG, "photo.png", "image/png")
DOC = ref(PDF, "report.pdf", "application/pdf")
TXT = ref(NOTES, 'my "notes".md', "text/markdown")
VOICE = ref(OGG, "voice.ogg", "audio/ogg")
SENT = ref(b"a,b\n1,2\n", "out.csv", "text/csv")
BLOBS = {IMG.hash: PNG, DOC.hash: PDF, TXT.hash: NOTES, VOICE.hash: OGG}
B64 = {h: base64.b64encode(d).decode() for h, d in BLOBS.items()}

MESSAGES = [
    {"role": "user", "content": [
        ref_block(IMG), ref_block(DOC), ref_block(TXT),
        ref_block(VOICE, transcript="call me back"),
        {"type": "text", "text": "what are these?"},
    ]},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "send_file",
         "input": {"name": "out.csv", "content": "a,b\n1,2\n"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "Sent out.csv."}, ref_block(SENT, sent=True)]}]},
]

TEXT_FILE = ('<file name="my &quot;notes&quot;.md" media_type="text/markdown">\n'
             '# Notes\nbuy "tea"\n\n</file>')
TRANSCRIPT = '<transcript of="voice.ogg" media_type="audio/ogg">\ncall me back\n</transcript>'


def test_anthropic_expansion_gives_image_document_and_text_blocks() -> None:
    """Images and PDFs become base64 image/document blocks, text files and transcripts text;
    a file the agent sent stays out of the body."""
    body = anthropic_body("SYS", MESSAGES, [], "claude-x", {"max_tokens": 10}, BLOBS)
    assert body["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": B64[IMG.hash]}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": B64[DOC.hash]}, "title": "report.pdf"},
        {"type": "text", "text": TEXT_FILE},
        {"type": "text", "text": TRANSCRIPT},
        {"type": "text", "text": "what are these?"},
    ]
    assert body["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "t1",
                                               "content": [{"type": "text",
                                                            "text": "Sent out.csv."}]}]


def test_openai_expansion_gives_content_parts() -> None:
    """OpenAI: image_url data URLs, file parts for PDFs, text parts; the tool result stays
    text."""
    body = openai_body("SYS", MESSAGES, [], "gpt-x", {}, BLOBS)
    assert body["messages"][1] == {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64[IMG.hash]}"}},
        {"type": "file", "file": {"filename": "report.pdf",
                                  "file_data": f"data:application/pdf;base64,{B64[DOC.hash]}"}},
        {"type": "text", "text": TEXT_FILE},
        {"type": "text", "text": TRANSCRIPT},
        {"type": "text", "text": "what are these?"},
    ]}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "t1",
                                   "content": "Sent out.csv."}


TOOL_FILES = [
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "cam__shot", "input": {}},
        {"type": "tool_use", "id": "t2", "name": "notes__get", "input": {}},
        {"type": "tool_use", "id": "t3", "name": "cam__scan", "input": {}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "[image: shot-1]"}, ref_block(IMG)]},
        {"type": "tool_result", "tool_use_id": "t2", "content": "no notes"},
        {"type": "tool_result", "tool_use_id": "t3", "content": [
            {"type": "text", "text": "[document: scan-1]"}, ref_block(DOC),
            ref_block(SENT, sent=True)]}]},
]


def test_files_from_tools_stay_in_the_anthropic_tool_result() -> None:
    """An image or PDF a tool returned becomes an image or document block inside its
    tool_result, after the text; a sent file stays out."""
    body = anthropic_body("S", TOOL_FILES, [], "m", {}, BLOBS)
    image, _, document = body["messages"][1]["content"]
    assert image["content"] == [
        {"type": "text", "text": "[image: shot-1]"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": B64[IMG.hash]}}]
    assert document["content"] == [
        {"type": "text", "text": "[document: scan-1]"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": B64[DOC.hash]}, "title": "report.pdf"}]


def test_files_from_tools_follow_the_openai_tool_messages() -> None:
    """OpenAI tool messages take text only: the files follow all of them in one user
    message, each result's files after a line naming its call; a sent file stays out."""
    body = openai_body("S", TOOL_FILES, [], "m", {}, BLOBS)
    assert body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "[image: shot-1]"},
        {"role": "tool", "tool_call_id": "t2", "content": "no notes"},
        {"role": "tool", "tool_call_id": "t3", "content": "[document: scan-1]"},
        {"role": "user", "content": [
            {"type": "text", "text": TOOL_FILES_INTRO.format(id="t1")},
            {"type": "image_url",
             "image_url": {"url": f"data:image/png;base64,{B64[IMG.hash]}"}},
            {"type": "text", "text": TOOL_FILES_INTRO.format(id="t3")},
            {"type": "file", "file": {
                "filename": "report.pdf",
                "file_data": f"data:application/pdf;base64,{B64[DOC.hash]}"}}]},
    ]
    assert needed(TOOL_FILES) == [IMG, DOC]


@pytest.mark.parametrize("shape", ["anthropic", "openai"])
def test_missing_blob_is_named(shape: str) -> None:
    """A reference whose bytes were not loaded raises BlobMissingError with hash and name."""
    with pytest.raises(BlobMissingError) as caught:
        request_body(shape, "S", MESSAGES[:1], [], "m", {},  # type: ignore[arg-type]
                     blobs={h: d for h, d in BLOBS.items() if h != DOC.hash})
    assert caught.value.digest == DOC.hash
    assert "report.pdf" in str(caught.value)
    assert DOC.hash in str(caught.value)
    assert isinstance(caught.value, SessionReadError)


@pytest.mark.parametrize("shape", ["anthropic", "openai"])
def test_messages_without_attachments_shape_as_before(shape: str) -> None:
    """Blobs change nothing for plain messages: the body equals the one built without them."""
    plain = [{"role": "user", "content": "hi"},
             {"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    assert request_body(shape, "S", plain, [], "m", {}, blobs=BLOBS) == \
        request_body(shape, "S", plain, [], "m", {})  # type: ignore[arg-type]


def test_malformed_attachment_block_is_an_error_not_a_pass_through() -> None:
    """An attachment block without a valid hash is never sent as it stands."""
    bad = [{"role": "user", "content": [{"type": "attachment", "hash": "xyz", "name": "a",
                                         "media_type": "image/png", "size": 1}]}]
    with pytest.raises(ValueError, match="malformed"):
        anthropic_body("S", bad, [], "m", {}, BLOBS)


def test_needed_lists_each_blob_once_and_skips_sent_files() -> None:
    """The blobs a body needs: in order of first use, each once, sent files not at all."""
    twice = [*MESSAGES, {"role": "user", "content": [ref_block(IMG)]}]
    assert [r.hash for r in needed(twice)] == [IMG.hash, DOC.hash, TXT.hash, VOICE.hash]


def test_referenced_finds_every_hash_in_a_log() -> None:
    """Retention sees inbound refs and sent files, and skips corrupt lines and non-messages."""
    lines = [orjson.dumps({"type": "session", "seq": 0, "version": 3})]
    for seq, message in enumerate(MESSAGES, start=1):
        lines.append(orjson.dumps({"type": "message", "seq": seq, "message": message}))
    lines.append(b'{"type":"attachment" not json')
    lines.append(orjson.dumps({"type": "note", "seq": 9, "x": ref_block(DOC)}))
    data = b"\n".join(lines) + b"\n"
    assert referenced(data) == {IMG.hash, DOC.hash, TXT.hash, VOICE.hash, SENT.hash}


def test_ref_block_round_trip_and_labels() -> None:
    """A reference block reads back as the same ref; sizes read like a person would say them."""
    assert ref_of(ref_block(IMG, transcript="x")) == IMG
    assert ref_of({"type": "attachment", "hash": IMG.hash, "name": "a",
                   "media_type": "image/png", "size": True}) is None
    assert [human_size(n) for n in (812, 48_230, 3 * 1024 * 1024)] == \
        ["812 bytes", "47.1 KB", "3.0 MB"]
    assert [category(t) for t in ("image/webp", "application/pdf", "audio/ogg", "video/mp4",
                                  "text/csv", "application/zip")] == \
        ["image", "pdf", "audio", "audio", "text", "other"]


def test_expansion_leaves_the_stored_message_untouched() -> None:
    """Shaping copies: the message list (the log's view) still holds references afterwards."""
    content = MESSAGES[0]["content"]
    before = orjson.dumps(content)
    expand_anthropic(content, BLOBS)
    openai_body(None, MESSAGES, [], "m", {}, BLOBS)
    assert orjson.dumps(content) == before

"""The web chat's attachments: files in ``POST /api/chat`` (JSON base64 and multipart), the
history's file list, ``GET /api/file`` (only files of the conversation asked about), and a
file the agent sends (``send_file``) as a download link."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from providers.offline import OfflineProvider
from tests.channels.test_web import Start, web_gateways
from tests.fakes import media
from tests.web_ids import WEB_TENANT

PHOTO = media.jpeg(80, 60)


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """Web-only gateways on demand (offline provider unless given), closed at the end."""
    async with web_gateways(tmp_path) as starter:
        yield starter
PHOTO_HASH = hashlib.sha256(PHOTO).hexdigest()


def attachment(data: bytes, name: str, media_type: str) -> dict[str, str]:
    return {"name": name, "media_type": media_type, "data": base64.b64encode(data).decode()}


async def test_json_attachment_with_text_and_history_lists_it(start: Start) -> None:
    """A base64 photo with a question is answered; the history lists it with a URL that
    serves the same bytes, as an image, sandboxed."""
    server = await start()
    status, body = await server.post({"conversation": "c1", "text": "what is this?",
                                      "attachments": [attachment(PHOTO, "cat.jpg",
                                                                 "image/jpeg")]})
    assert status == 200
    assert "It came with 1 image." in body["reply"]  # the offline provider saw the image
    status, page = await server.get("/api/history?conversation=c1")
    assert status == 200
    user = page["messages"][0]
    assert (user["role"], user["text"]) == ("user", "what is this?")
    url = f"/api/file?conversation=c1&hash={PHOTO_HASH}"
    assert user["files"] == [{"name": "cat.jpg", "media_type": "image/jpeg",
                              "size": len(PHOTO), "hash": PHOTO_HASH, "sent": False,
                              "url": url}]
    async with server.client.get(server.base + url) as response:
        assert response.status == 200
        assert await response.read() == PHOTO
        assert response.headers["Content-Type"] == "image/jpeg"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in response.headers["Content-Security-Policy"]


async def test_multipart_file_alone_is_a_message(start: Start) -> None:
    """A multipart request with a PDF and no text is recorded and answered."""
    server = await start()
    form = aiohttp.FormData()
    form.add_field("conversation", "c2")
    form.add_field("file", media.PDF, filename="q3.pdf", content_type="application/pdf")
    async with server.client.post(server.base + "/api/chat", data=form) as response:
        assert response.status == 200
        body = await response.json()
    assert body["reply"].endswith("It came with 1 document (q3.pdf).")
    _, page = await server.get("/api/history?conversation=c2")
    assert [f["name"] for f in page["messages"][0]["files"]] == ["q3.pdf"]


async def test_files_are_served_only_to_their_conversation(start: Start) -> None:
    """A hash from another conversation, or one no message refers to, is a 404; a non-image
    file is a download (octet-stream, attachment), never rendered as a page."""
    server = await start()
    html = b"<html><script>alert(1)</script></html>"
    await server.post({"conversation": "mine", "text": "two files", "attachments": [
        attachment(PHOTO, "cat.jpg", "image/jpeg"),
        attachment(html, "page.html", "text/html")]})
    html_hash = hashlib.sha256(html).hexdigest()
    for query in (f"conversation=other&hash={PHOTO_HASH}",
                  f"conversation=mine&hash={hashlib.sha256(b'x').hexdigest()}"):
        status, body = await server.get(f"/api/file?{query}")
        assert (status, body) == (404, {"error": "no such file in this conversation"})
    status, body = await server.get("/api/file?conversation=mine&hash=../../etc")
    assert status == 400
    async with server.client.get(
            f"{server.base}/api/file?conversation=mine&hash={html_hash}") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["Content-Disposition"].startswith("attachment;")


async def test_bad_attachments_are_400s_and_record_nothing(start: Start) -> None:
    """Malformed attachment fields are refused with a clear 400 before anything is stored."""
    server = await start()
    cases: list[tuple[Any, str]] = [
        ("not a list", '"attachments" must be a list'),
        ([{"name": "a.txt"}], 'attachment 1: "data" is required: the file as base64'),
        ([{"data": "%%%not base64%%%"}], 'attachment 1: "data" is not valid base64'),
        ([5], "attachment 1 must be an object"),
    ]
    for attachments, error in cases:
        status, body = await server.post({"conversation": "c", "text": "x",
                                           "attachments": attachments})
        assert (status, body) == (400, {"error": error})
    status, body = await server.post({"conversation": "c", "text": " "})
    assert (status, body) == (400, {"error": '"text" is empty'})
    assert server.session_files() == []


class SendsAFile(OfflineProvider):
    """Asks for send_file once, then answers."""

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        last = request.messages[-1]["content"]
        if isinstance(last, list) and last and last[0].get("type") == "tool_result":
            return ProviderResponse({"role": "assistant", "content": [
                {"type": "text", "text": "There you go."}]}, "end_turn")
        return ProviderResponse({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "send_file",
             "input": {"name": "totals.csv", "content": "month,total\njan,3\n"}}]}, "tool_use")


async def test_send_file_becomes_a_download_link(start: Start) -> None:
    """The agent's file arrives as an SSE ``file`` event with a working link, is recorded in
    the tool result by hash, and shows in the history as a sent file."""
    server = await start(provider=SendsAFile())
    events = await server.stream({"conversation": "f", "text": "send me the totals"})
    names = [name for name, _ in events]
    assert names == ["session", "file", "done"]
    shown = events[1][1]
    data = b"month,total\njan,3\n"
    digest = hashlib.sha256(data).hexdigest()
    assert shown == {"name": "totals.csv", "media_type": "text/csv", "size": len(data),
                     "hash": digest, "sent": True,
                     "url": f"/api/file?conversation=f&hash={digest}"}
    async with server.client.get(server.base + shown["url"]) as response:
        assert await response.read() == data
    _, page = await server.get("/api/history?conversation=f")
    result = page["messages"][2]
    assert result["files"] == [shown]
    session = events[0][1]["session"]
    log = server.store.path_of(WEB_TENANT, session).read_bytes()
    entries = [orjson.loads(line) for line in log.splitlines()]
    [tool_result] = [block for e in entries if e["type"] == "message"
                     and isinstance(e["message"]["content"], list)
                     for block in e["message"]["content"] if block["type"] == "tool_result"]
    assert tool_result["content"][1] == {
        "type": "attachment", "hash": digest, "name": "totals.csv", "media_type": "text/csv",
        "size": len(data), "sent": True}


async def test_json_reply_lists_sent_files(start: Start, tmp_path: Path) -> None:
    """Without streaming, the answer carries the files the agent sent."""
    server = await start(provider=SendsAFile())
    status, body = await server.post({"conversation": "g", "text": "totals please"})
    assert status == 200
    assert [f["name"] for f in body["files"]] == ["totals.csv"]
    assert body["reply"] == "There you go."

"""The gateway's Bot API transport over aiohttp (``AiohttpRequest``) sends what PTB's own
``HTTPXRequest`` sends, downloads files, and fails the way PTB expects (``TimedOut``,
``NetworkError`` without the token), driven by the real PTB against the fake Bot API."""

from __future__ import annotations

from typing import Any

import pytest
import telegram
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, HTTPXRequest

from channels.telegram.request import AiohttpRequest
from tests.fakes.telegram_api import FakeTelegramServer
from tests.ports import refusing_port


async def calls_through(request: BaseRequest) -> tuple[list[tuple[str, Any]], list[Any], bytes]:
    """Three calls (a message, a document with a caption, a file download) through
    ``request``, and what the fake saw."""
    async with FakeTelegramServer() as tg:
        tg.user_message(42, "hi")  # the chat exists
        stored = tg.add_file(b"file bytes \x00\xff", suffix=".bin")
        bot = telegram.Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url,
                           request=request)
        async with bot:
            await bot.send_message(42, "hello <b>there</b> & ünïcode", parse_mode="HTML",
                                   disable_notification=True)
            await bot.send_document(42, document=b"%PDF-1.4 body", filename="report.pdf",
                                    caption="the report")
            file = await bot.get_file(stored["file_id"])
            downloaded = bytes(await file.download_as_bytearray())
        sent = [(c.method, c.params) for c in tg.sent if c.method != "getMe"]
        documents = [(chat, f.filename, f.content_type, f.data) for chat, f in tg.documents]
        return sent, documents, downloaded


async def test_the_same_requests_as_ptbs_own_transport() -> None:
    """Parameters (form-encoded), an upload (multipart) and a download: what the Bot API
    receives is the same through either transport."""
    ours = await calls_through(AiohttpRequest(2))
    ptbs = await calls_through(HTTPXRequest(connection_pool_size=2))
    assert ours == ptbs
    sent, documents, downloaded = ours
    assert [method for method, _ in sent] == ["sendMessage", "sendDocument", "getFile"]
    assert documents == [(42, "report.pdf", "application/pdf", b"%PDF-1.4 body")]
    assert downloaded == b"file bytes \x00\xff"


async def test_a_read_timeout_is_timed_out() -> None:
    """An answer slower than the read timeout: PTB's TimedOut (the fake holds it 10 s)."""
    async with FakeTelegramServer() as tg:
        bot = telegram.Bot(tg.token, base_url=tg.base_url,
                           request=AiohttpRequest(2, read_timeout=0.5))
        async with bot:
            tg.delay_next("sendMessage", 10.0)
            with pytest.raises(TimedOut):
                await bot.send_message(42, "slow")


async def test_a_refused_connection_is_a_network_error_without_the_token() -> None:
    token = "123456:SECRET-token-value"
    request = AiohttpRequest(1)
    await request.initialize()
    try:
        with refusing_port() as port, pytest.raises(NetworkError) as caught:
            await request.post(f"http://127.0.0.1:{port}/bot{token}/getMe")
    finally:
        await request.shutdown()
    assert "SECRET" not in str(caught.value)
    assert not isinstance(caught.value, TimedOut)


async def test_shutdown_is_idempotent_and_a_request_needs_initialize() -> None:
    request = AiohttpRequest(1)
    with pytest.raises(RuntimeError):
        await request.do_request("http://127.0.0.1:9/x", "GET")
    await request.initialize()
    await request.shutdown()
    await request.shutdown()

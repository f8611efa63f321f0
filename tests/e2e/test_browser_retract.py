"""The chat page in headless Chromium: a reply its worker abandoned (the lease went to another
worker, which answers into the same request) is taken back from the page, and only the new
answer stays. The gateway is real; the ``retract`` event is sent as the router sends it, by
the web sink of the request (``WebSink.retract``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from channels.web.channel import WebChannel
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from tests.capabilities import needs
from tests.e2e.test_browser_chat import CHROMIUM, browser, send
from tests.fakes.scripted_provider import ScriptedProvider

__all__ = ["browser"]  # the fixture, shared with the chat tests

pytestmark = [
    pytest.mark.browser,
    needs(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)", CHROMIUM.exists()),
]


class Interrupted(ScriptedProvider):
    """Streams a first attempt, then waits (as a worker that lost its lease would stop) until
    the test lets the new holder's answer stream."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = asyncio.Event()
        self.go_on = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        assert on_text is not None
        await on_text("first attempt, never finished")
        self.shown.set()
        await asyncio.wait_for(self.go_on.wait(), 30)
        self.script("the answer that stays")
        return await super().complete(request, on_text)


async def test_a_retracted_reply_is_cleared_and_only_the_new_answer_stays(
        tmp_path: Path, browser: Browser) -> None:
    provider = Interrupted()
    settings = Settings(  # type: ignore[call-arg]  # pydantic-settings init, by variable name
        _env_file=None, GATEWAY_DATA_DIR=tmp_path, GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0,
        GATEWAY_CHANNELS="web", GATEWAY_WEB_TOKEN=None, GATEWAY_SHUTDOWN_GRACE=0.5,
    )
    gw: Gateway = build_gateway(settings, provider=provider)
    await gw.start()
    try:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"http://127.0.0.1:{gw.bound_port}/")
        await send(page, "hello")
        assistant = page.locator("li.message.assistant")
        await expect(assistant).to_have_text("first attempt, never finished")
        await asyncio.wait_for(provider.shown.wait(), 10)

        web = next(c for c in gw.channels if isinstance(c, WebChannel))
        (sink,) = web.waiting()  # the one request in flight
        await sink.retract()
        await expect(assistant).to_have_text("")
        await expect(assistant).to_have_class(re.compile(r"\bpending\b"))  # still waiting

        provider.go_on.set()
        await expect(assistant).to_have_text("the answer that stays")
        await expect(assistant).not_to_have_class(re.compile(r"\bpending\b"))
        assert errors == []
    finally:
        provider.go_on.set()
        await gw.aclose()

"""A reminder firing reaches the open chat page without a reload: headless Chromium against
the `make run` gateway (web chat, offline provider) with a fake clock the test moves."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import Browser, async_playwright, expect

from app.compose import build_gateway
from app.server import Gateway
from channels.web.identity import COOKIE
from tests.capabilities import needs
from tests.channels.test_web import settings
from tests.e2e.test_browser_chat import ARGS, CHROMIUM, send
from tests.fakes.clock import FakeClock
from tests.waiting import WAIT

pytestmark = [
    pytest.mark.browser,
    needs(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)", CHROMIUM.exists()),
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def test_the_open_page_shows_a_reminder_when_it_fires(browser: Browser,
                                                            tmp_path: Path) -> None:
    """Set in the page, confirmed there; two minutes later (fake clock) "Reminder: stretch"
    appears in the same page, once, with no reload and nothing typed."""
    clock = FakeClock(1_790_000_000.0)
    gateway: Gateway = build_gateway(settings(tmp_path), clock=clock)
    await gateway.start()
    try:
        base = f"http://127.0.0.1:{gateway.bound_port}"
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(base + "/")
        await send(page, "remind me in 2 minutes to stretch")
        answers = page.locator("li.message.assistant")
        await expect(answers).to_have_text([re.compile(r"Done: Scheduled s[0-9a-f]{8}: once")],
                                           timeout=WAIT * 1000)
        conversation = await page.evaluate("localStorage.getItem('gateway.conversation')")
        # Asked as this browser (its identity cookie): the conversation is its person's.
        [cookie] = [c["value"] for c in await page.context.cookies() if c["name"] == COOKIE]
        async with aiohttp.ClientSession() as http, http.get(
                f"{base}/api/history?conversation={conversation}&limit=0",
                headers={"Cookie": f"{COOKIE}={cookie}"}) as response:
            total = (await response.json())["total"]
        # The page knows what it shows (the sign it would notice more), then time moves on.
        await expect(page.locator("#messages")).to_have_attribute("data-total", str(total),
                                                                  timeout=WAIT * 1000)
        clock.advance(120)
        reminder = page.locator("li.message.assistant", has_text="Reminder: stretch")
        await expect(reminder).to_have_count(1, timeout=WAIT * 1000)
        # The trigger is a note of the schedule's, not a message the person typed.
        await expect(page.locator("li.message.scheduled")).to_have_text(
            [re.compile(r"^scheduled: s[0-9a-f]{8} Remind them to stretch$")])
        await expect(page.locator("li.message.user")).to_have_text(
            ["remind me in 2 minutes to stretch"])
        assert errors == []
    finally:
        await gateway.aclose()

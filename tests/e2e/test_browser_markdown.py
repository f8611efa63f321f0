"""The chat page in headless Chromium: answers rendered as Markdown without letting the
model's HTML run, and a message sent while the gateway is down kept as "not sent" with a
Retry that delivers it once the gateway is back."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.provider import Provider
from tests.capabilities import needs
from tests.e2e.test_browser_chat import CHROMIUM, browser, send
from tests.fakes.scripted_provider import ScriptedProvider

__all__ = ["browser"]  # the fixture, shared with the chat tests

pytestmark = [
    pytest.mark.browser,
    needs(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)", CHROMIUM.exists()),
]

HOSTILE = (
    "Here is **bold**, `code` and a list:\n\n- one\n- two\n\n"
    "<script>window.__pwned = 1</script>\n\n"
    '<img src="x" onerror="window.__pwned = 2">\n\n'
    "[click me](javascript:window.__pwned=3) and [docs](https://example.org/a)"
)


def gateway_settings(data_dir: Path, port: int = 0) -> Settings:
    return Settings(  # type: ignore[call-arg]  # pydantic-settings init, by variable name
        _env_file=None, GATEWAY_DATA_DIR=data_dir, GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=port,
        GATEWAY_CHANNELS="web", GATEWAY_WEB_TOKEN=None, GATEWAY_SHUTDOWN_GRACE=0.2,
    )


async def started(data_dir: Path, provider: Provider, port: int = 0) -> Gateway:
    gateway = build_gateway(gateway_settings(data_dir, port), provider=provider)
    await gateway.start()
    return gateway


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    assert errors == []


async def test_answers_render_as_markdown_and_model_html_never_runs(
    page: Page, tmp_path: Path
) -> None:
    """Bold, code, lists and links render; the model's <script>, <img onerror> and a
    javascript: link stay inert text, during the stream, at the end and after a reload."""
    provider = ScriptedProvider()
    provider.script(HOSTILE)
    gateway = await started(tmp_path, provider)
    try:
        await page.goto(f"http://127.0.0.1:{gateway.bound_port}/")
        await send(page, "show me markdown")
        answer = page.locator("li.message.assistant")
        await expect(answer).not_to_have_class(re.compile("pending"))
        for _ in range(2):  # as answered, then as the history shows it after a reload
            await expect(answer.locator("strong")).to_have_text("bold")
            await expect(answer.locator("code")).to_have_text("code")
            await expect(answer.locator("li")).to_have_text(["one", "two"])
            assert await answer.locator("script, img, iframe").count() == 0
            assert "<script>window.__pwned = 1</script>" in (await answer.inner_text())
            links = answer.locator("a")
            await expect(links).to_have_count(1)
            assert await links.get_attribute("href") == "https://example.org/a"
            assert await links.get_attribute("rel") == "noopener noreferrer nofollow"
            assert await page.evaluate("() => window.__pwned") is None
            await page.reload()
            answer = page.locator("li.message.assistant")
        await expect(page.locator("li.message.user")).to_have_text("show me markdown")
    finally:
        await gateway.aclose()


async def test_a_message_sent_while_the_gateway_is_down_can_be_retried(
    page: Page, tmp_path: Path
) -> None:
    """With the gateway stopped, a sent message stays on the page marked "Not sent" and the
    status says the gateway cannot be reached; once it is back, Retry delivers it once."""
    # Port 0, then the port it got: a free port found beforehand could be taken before the
    # gateway bound it. (The restart below must come back on the same port: the page's.)
    gateway = await started(tmp_path, ScriptedProvider())
    port = gateway.bound_port
    await page.goto(f"http://127.0.0.1:{port}/")
    await gateway.aclose()

    await send(page, "are you there?")
    mine = page.locator("li.message.user")
    await expect(mine).to_have_class(re.compile("unsent"))
    await expect(mine).to_contain_text("Not sent.")
    await expect(page.locator("#status")).to_contain_text("Cannot reach the gateway")
    assert await page.locator("li.message.assistant").count() == 0

    provider = ScriptedProvider()
    provider.script("here now")
    gateway = await started(tmp_path, provider, port)
    try:
        await mine.get_by_role("button", name="Retry").click()
        await expect(page.locator("li.message.assistant")).to_have_text("here now")
        await expect(mine).not_to_have_class(re.compile("unsent"))
        await expect(mine).to_have_text("are you there?")
        await expect(page.locator("#status")).to_have_text("")
        infos = await gateway.store.list_sessions(None)
    finally:
        await gateway.aclose()
    assert [(i.message_count, i.first_user_text) for i in infos] == [(2, "are you there?")]

"""The chat page in headless Chromium against a real gateway: stream, reload, history."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.providers.offline import OfflineProvider

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
OUTPUT = Path(__file__).resolve().parents[2] / "test-output"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway whose offline provider streams slowly enough to watch."""
    settings = Settings(  # type: ignore[call-arg]  # pydantic-settings init, by variable name
        _env_file=None, GATEWAY_DATA_DIR=tmp_path, GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0,
        GATEWAY_CHANNELS="web", GATEWAY_WEB_TOKEN=None, GATEWAY_SHUTDOWN_GRACE=0.5,
    )
    gw = build_gateway(settings, provider=OfflineProvider(delay=0.08))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.aclose()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def send(page: Page, text: str) -> None:
    await page.get_by_label("Message").fill(text)
    await page.get_by_role("button", name="Send").click()


async def test_chat_streams_the_reply_and_keeps_history(
    gateway: Gateway, browser: Browser, tmp_path: Path
) -> None:
    """Typed text streams back into the page, and a reload shows the same conversation."""
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"http://127.0.0.1:{gateway.bound_port}/")
    await expect(page.get_by_text("No messages yet")).to_be_visible()

    await send(page, "hello browser")
    # Partial text while the bubble is still pending: the reply is arriving as a stream.
    await page.wait_for_function(
        "() => { const b = document.querySelector('li.message.assistant.pending');"
        " return b !== null && b.textContent.length > 0; }"
    )
    assistant = page.locator("li.message.assistant")
    await expect(assistant).to_have_text(re.compile(r'You said: "hello browser"\. I can see'))
    await expect(assistant).not_to_have_class(re.compile("pending"))
    session = await page.locator("#session-id").text_content()
    assert session
    assert (tmp_path / "sessions" / f"{session}.jsonl").is_file()
    await expect(page.locator("#replay-command")).to_have_text(f"gateway replay {session}")

    await send(page, "and again")
    await expect(assistant).to_have_count(2)
    await expect(assistant.nth(1)).to_have_text(re.compile(r'You said: "and again"'))
    await expect(assistant.nth(1)).not_to_have_class(re.compile("pending"))

    await page.reload()
    messages = page.locator("li.message")
    await expect(messages).to_have_count(4)
    assert [await m.get_attribute("data-role") for m in await messages.all()] == [
        "user", "assistant", "user", "assistant",
    ]
    await expect(messages.nth(0)).to_have_text("hello browser")
    await expect(messages.nth(2)).to_have_text("and again")
    await expect(page.locator("#session-id")).to_have_text(session)

    OUTPUT.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT / "chat.png"), full_page=True)
    assert errors == []


async def test_token_prompt_then_chat(tmp_path: Path, browser: Browser) -> None:
    """With GATEWAY_WEB_TOKEN the page asks for the token, then chats with it."""
    settings = Settings(  # type: ignore[call-arg]  # pydantic-settings init, by variable name
        _env_file=None, GATEWAY_DATA_DIR=tmp_path, GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0,
        GATEWAY_CHANNELS="web", GATEWAY_WEB_TOKEN="browser-token", GATEWAY_SHUTDOWN_GRACE=0.5,
    )
    gw = build_gateway(settings, provider=OfflineProvider())
    await gw.start()
    try:
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{gw.bound_port}/")
        token = page.get_by_label("This gateway needs an access token")
        await expect(token).to_be_visible()
        await token.fill("browser-token")
        await page.get_by_role("button", name="Use token").click()
        await expect(token).to_be_hidden()
        await send(page, "with a token")
        await expect(page.locator("li.message.assistant")).to_have_text(
            re.compile(r'You said: "with a token"'))
    finally:
        await gw.aclose()

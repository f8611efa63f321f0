"""The chat page in headless Chromium against a real gateway: stream, reload, history."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from app.compose import build_gateway
from app.config import Settings
from app.hints import replay_hint
from app.server import Gateway
from gateway.edge.ids import WEB_TENANT
from providers.offline import OfflineProvider
from tests.capabilities import needs

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
BROWSER_TOKEN = "browser-token-for-tests"

pytestmark = [
    pytest.mark.browser,
    needs(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)", CHROMIUM.exists()),
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
    assert (tmp_path / "tenants" / "web" / "sessions" / f"{session}.jsonl").is_file()
    # The hint is the command as the operator types it here, and it works as printed.
    hint = replay_hint(tmp_path, WEB_TENANT).format(session=session)
    await expect(page.locator("#replay-command")).to_have_text(hint)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    replayed = await asyncio.to_thread(subprocess.run, hint, shell=True, capture_output=True,
                                       text=True, env=env, timeout=120, check=False)
    assert (replayed.returncode, f"session {session}" in replayed.stdout) == (0, True), \
        replayed.stderr

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


async def test_a_turn_with_a_tool_round_is_one_bubble_after_a_reload(
    gateway: Gateway, browser: Browser
) -> None:
    """The memory turn (a call that asks for memory_write, then the answer after it) streams
    into one bubble, and a reload shows that same one bubble with the same text, not two."""
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{gateway.bound_port}/")
    await send(page, "remember that I like tea")
    assistant = page.locator("li.message.assistant")
    await expect(assistant).to_have_count(1)
    await expect(assistant).not_to_have_class(re.compile("pending"))
    live = await assistant.inner_text()
    assert live.splitlines()[0] == "I'll remember that."  # the first call's text
    assert "saved to memory" in live  # and the second's, in the same bubble

    await page.reload()
    messages = page.locator("li.message")
    await expect(messages).to_have_count(2)
    assert [await m.get_attribute("data-role") for m in await messages.all()] == [
        "user", "assistant"]
    assert await messages.nth(1).inner_text() == live


async def test_token_prompt_then_chat(tmp_path: Path, browser: Browser) -> None:
    """With GATEWAY_WEB_TOKEN the page asks for the token, then chats with it."""
    settings = Settings(  # type: ignore[call-arg]  # pydantic-settings init, by variable name
        _env_file=None, GATEWAY_DATA_DIR=tmp_path, GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=0,
        GATEWAY_CHANNELS="web", GATEWAY_WEB_TOKEN=BROWSER_TOKEN, GATEWAY_SHUTDOWN_GRACE=0.5,
    )
    gw = build_gateway(settings, provider=OfflineProvider())
    await gw.start()
    try:
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{gw.bound_port}/")
        token = page.get_by_label("This gateway needs an access token")
        await expect(token).to_be_visible()
        await token.fill(BROWSER_TOKEN)
        await page.get_by_role("button", name="Use token").click()
        await expect(token).to_be_hidden()
        await send(page, "with a token")
        await expect(page.locator("li.message.assistant")).to_have_text(
            re.compile(r'You said: "with a token"'))
    finally:
        await gw.aclose()


async def test_attached_image_shows_a_thumbnail_and_gets_a_reply(
    gateway: Gateway, browser: Browser, tmp_path: Path
) -> None:
    """An image picked with the Attach button is previewed, sent with the text, shown as a
    thumbnail in the person's bubble, answered (the offline provider saw the image), and
    still shown, fetched from the gateway, after a reload; a file dropped on the composer is
    listed to send."""
    from tests.fakes import media

    photo = tmp_path / "cat.jpg"
    photo.write_bytes(media.jpeg(120, 90))
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"http://127.0.0.1:{gateway.bound_port}/")
    async with page.expect_file_chooser() as chooser:
        await page.get_by_role("button", name="Attach").click()
    await (await chooser.value).set_files(str(photo))
    preview = page.locator("#pending-files li img.thumbnail")
    await expect(preview).to_have_attribute("alt", "cat.jpg")
    await send(page, "what is in this picture?")
    await expect(page.locator("#pending-files li")).to_have_count(0)
    sent = page.locator("li.message.user img.thumbnail")
    await expect(sent).to_have_attribute("alt", "cat.jpg")
    assistant = page.locator("li.message.assistant")
    await expect(assistant).to_have_text(re.compile(r"It came with 1 image\."))
    assert await sent.evaluate("img => img.naturalWidth") == 120

    await page.reload()
    stored = page.locator("li.message.user img.thumbnail")
    await expect(stored).to_have_attribute("alt", "cat.jpg")
    await page.wait_for_function(
        "() => { const i = document.querySelector('li.message.user img.thumbnail');"
        " return i !== null && i.complete && i.naturalWidth === 120; }")
    OUTPUT.mkdir(exist_ok=True)
    await page.screenshot(path=str(OUTPUT / "chat-attachment.png"), full_page=True)

    # Dropped on the composer, a file joins the list to send, as a chip with its size.
    dropped = await page.evaluate_handle(
        "() => { const d = new DataTransfer();"
        " d.items.add(new File(['# notes'], 'notes.md', {type: 'text/markdown'})); return d; }")
    await page.locator("#composer").dispatch_event("drop", {"dataTransfer": dropped})
    await expect(page.locator("#pending-files li .file-chip")).to_have_text("notes.md 7 bytes")
    assert errors == []

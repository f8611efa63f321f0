"""The session viewer in headless Chromium: a real recorded session, clicked through end to end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright, expect

from app.admin import Access, AdminSite
from gateway.persona.workspace import seed_if_empty
from sessions.jsonl import JsonlSessionStore
from tests.app.admin.helpers import TOKEN, serve
from tests.capabilities import needs
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "test-output" / "viewer-session.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    needs(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)", CHROMIUM.exists()),
]


async def record_session(tmp_path: Path) -> JsonlSessionStore:
    """One turn: memory_write (a tool round, prompt rebuilt mid-turn), then a text answer."""
    persona = tmp_path / "persona"
    seed_if_empty(persona, "Lisa")
    # What the model remembered earlier about this person (the memory channel's "user").
    scope = persona / "memory" / "default" / "memory" / "people" / "user"
    scope.mkdir(parents=True)
    (scope / "MEMORY.md").write_text("- Ada likes tea.\n")
    provider = ScriptedProvider()
    provider.script(
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me note that."},
            {"type": "tool_use", "id": "t1", "name": "memory_write",
             "input": {"text": "Ada prefers short answers."}},
        ]},
        "Noted: short answers from now on.",
    )
    store = JsonlSessionStore(tmp_path / "data")
    async with running_core(store, provider, persona) as core:
        await core.channel.say("c1", "Please remember that I like short answers.")
        await core.channel.wait_replies(1)
    return store


@asynccontextmanager
async def browser_page() -> AsyncIterator[tuple[Page, list[str]]]:
    """A fresh page; the list collects console errors (a CSP violation would land there)."""
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []

            def on_console(message: Any) -> None:
                if message.type == "error":
                    errors.append(message.text)

            page.on("console", on_console)
            yield page, errors
        finally:
            await browser.close()


async def test_viewer_walkthrough_marker_request_diff_and_chart(tmp_path: Path) -> None:
    """Sign in, open the session, see the marker, a call's prompt, the chart and the diff."""
    store = await record_session(tmp_path)
    async with serve(AdminSite(store, Access(TOKEN))) as viewer, browser_page() as (page, errors):
        await page.goto(viewer.base + "/admin/")
        await page.fill("input[name=token]", TOKEN)
        await page.click("form.login button[type=submit]")
        await expect(page.locator("h1")).to_have_text("Sessions")
        errors.clear()  # the sign-in page itself was a 401, which Chromium logs as an error
        link = page.locator("table.sessions a").first
        await expect(page.locator("table.sessions")).to_contain_text("I like short answers")
        await link.click()

        marker = page.locator(".marker", has_text="rebuilt:memory_write")
        await expect(marker).to_be_visible()
        await expect(marker).to_contain_text("Prompt changed: v2")
        call = page.locator("details#call-2")
        prompt = call.locator("pre.prompt")
        await expect(prompt).to_be_hidden()
        await call.locator("> summary").click()
        await expect(prompt).to_be_visible()
        await expect(prompt).to_contain_text("You are Lisa")
        await expect(prompt).to_contain_text("Ada prefers short answers.")

        chart = page.locator("#drift svg.drift-chart")
        await expect(chart).to_be_visible()
        assert await chart.locator("polyline, path").count() >= 1
        await expect(chart).to_contain_text("prompt version")
        await expect(chart.locator(".legend")).to_contain_text("memory")
        SCREENSHOT.parent.mkdir(exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)

        form = page.locator("#versions form.diff-form")
        await form.locator("select[name=a]").select_option("1")
        await form.locator("select[name=b]").select_option("2")
        await form.locator("button[type=submit]").click()
        await expect(page.locator("h1")).to_have_text("Prompt v1 → v2")
        memory = page.locator("section.sdiff[data-section=memory]")
        await expect(memory).to_have_attribute("data-status", "changed")
        await expect(memory.locator(".add").last).to_have_text("+ Ada prefers short answers.")
        await expect(memory.locator(".same").last).to_have_text("  - Ada likes tea.")
    assert errors == []


async def test_lazy_call_details_load_when_opened(tmp_path: Path) -> None:
    """Over the inline budget, opening a call fetches its request with the page script."""
    store = await record_session(tmp_path)
    site = AdminSite(store, Access(None), inline_budget=0)
    async with serve(site) as viewer, browser_page() as (page, errors):
        await page.goto(viewer.base + "/admin/")
        await page.locator("table.sessions a").first.click()
        call = page.locator("details#call-1")
        await expect(call.locator(".lazy")).to_have_count(1)
        await call.locator("> summary").click()
        await expect(call.locator("pre.prompt")).to_contain_text("- Ada likes tea.")
        await expect(call.locator(".lazy")).to_have_count(0)
        await page.click("[data-action=toggle-calls]")
        await expect(page.locator("details#call-2 pre.prompt")).to_contain_text(
            "Ada prefers short answers.")
    assert errors == []

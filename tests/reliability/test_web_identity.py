"""Limits keyed on identities the server controls, against a real running gateway: a web
client cannot escape the per-person rate limit by rotating conversation ids, a browser (the
cookie the chat page sets) is its own person, a conversation id is its person's own (two
people picking the same id never share it), and the web chat's spending is its own tenant's,
never Telegram's."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import aiohttp
from PIL import Image

from channels.web.convert import own_conversation
from channels.web.identity import COOKIE, NEW_PER_ADDRESS, WebIdentities
from gateway.edge.ids import MAX_NAME_LENGTH, valid_id
from tests.reliability.support import wait_until
from tests.reliability.test_bad_input import TG_USER, Stack, running_stack
from tests.reliability.test_platform_input import webhook

RATE_LIMITED = "You're sending messages faster than I can keep up with"
TENANT_SPENT = "used up today's allowance"


async def say(http: aiohttp.ClientSession, stack: Stack, conversation: str,
              headers: dict[str, str] | None = None) -> str:
    """Post a message; its reply (or error) text."""
    async with http.post(stack.base + "/api/chat", json={"conversation": conversation,
                                                         "text": "hello"},
                         headers=headers or {}) as response:
        body: dict[str, Any] = await response.json()
        assert response.status == 200, body
        return str(body["reply"])


def limited(replies: list[str]) -> list[bool]:
    return [RATE_LIMITED in reply for reply in replies]


async def test_rotating_conversation_ids_does_not_escape_the_rate_limit(
        tmp_path: Path) -> None:
    """Two messages an hour per person: a client without a cookie that uses a new conversation
    id for each message is still one person (its address), so the third is refused."""
    async with running_stack(tmp_path, rate_limit_messages=2, rate_limit_seconds=3600) as stack:
        replies = [await say(stack.http, stack, f"fresh-{n}") for n in range(3)]
    assert limited(replies) == [False, False, True]


async def test_a_browser_with_the_page_cookie_is_its_own_person(tmp_path: Path) -> None:
    """The chat page gives a browser an identity cookie: the browser and a cookie-less client
    at the same address each get their two messages; the browser's third is refused; a forged
    cookie counts as the cookie-less address (already at its limit)."""
    async with running_stack(tmp_path, rate_limit_messages=2, rate_limit_seconds=3600) as stack, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(stack.base + "/") as response:
            assert response.status == 200
            assert COOKIE in response.cookies
        mine = [await say(browser, stack, f"b-{n}") for n in range(2)]
        theirs = [await say(stack.http, stack, f"a-{n}") for n in range(2)]
        mine.append(await say(browser, stack, "b-2"))
        forged = await say(stack.http, stack, "f-0", {"Cookie": f"{COOKIE}=abc.0123"})
    assert limited(mine) == [False, False, True]
    assert limited(theirs) == [False, False]
    assert limited([forged]) == [True]


async def test_web_spending_does_not_lock_telegram_out(tmp_path: Path) -> None:
    """With a tenant budget the web chat (in its own tenant, the shipped default) uses up,
    the next web message is refused, while a Telegram user (the default tenant) is answered
    as usual."""
    async with running_stack(tmp_path, budget_tenant_tokens=1, web_tenant="web") as stack:
        first = await say(stack.http, stack, "w-0")
        second = await say(stack.http, stack, "w-1")
        assert stack.telegram is not None
        assert await webhook(stack, stack.telegram.user_message(TG_USER, "hi there")) == 200
        await wait_until(lambda: bool(stack.telegram and stack.telegram.texts_to(TG_USER)))
        telegram_reply = stack.telegram.texts_to(TG_USER)
    assert (TENANT_SPENT in first, TENANT_SPENT in second) == (False, True)
    assert not any(TENANT_SPENT in text for text in telegram_reply)


def test_an_address_gets_only_so_many_new_identities() -> None:
    """Page loads without a cookie get a new browser identity each, NEW_PER_ADDRESS an hour
    per address; then the address itself is the person until the hour has passed; another
    address is not affected (a fake clock)."""
    now = [0.0]
    identities = WebIdentities(b"k" * 32, clock=lambda: now[0])
    issued = [identities.for_page(None, "203.0.113.1") for _ in range(NEW_PER_ADDRESS + 1)]
    assert [i.cookie is not None for i in issued] == [True] * NEW_PER_ADDRESS + [False]
    assert issued[-1].person == identities.of(None, "203.0.113.1")
    assert identities.for_page(None, "203.0.113.2").cookie is not None
    now[0] += 3601
    assert identities.for_page(None, "203.0.113.1").cookie is not None


def test_identities_come_from_the_server_only() -> None:
    """A cookie is honoured only as the server signed it; with a token, everyone holding it
    is the token's one person (never the token itself in the id)."""
    identities = WebIdentities(b"k" * 32)
    page = identities.for_page(None, "203.0.113.1")
    assert page.cookie is not None
    assert identities.of(page.cookie, "198.51.100.9") == page.person
    browser, _, mac = page.cookie.partition(".")
    assert identities.of(f"{browser}x.{mac}", "198.51.100.9") == identities.of(
        None, "198.51.100.9")
    with_token = WebIdentities(b"k" * 32, token=b"t0ken-for-the-tests")
    assert with_token.of(page.cookie, "a") == with_token.of(None, "b")
    assert "t0ken" not in with_token.of(None, "a")


async def test_two_people_choosing_the_same_conversation_id_never_share_it(
        tmp_path: Path) -> None:
    """Two browsers (each with the cookie its chat page set) and a cookie-less client all pick
    the conversation id ``shared``: three sessions; each one's history holds its own words
    only, and a file one of them sent is "not found" from the others."""
    png = base64.b64encode(tiny_png()).decode()
    async with running_stack(tmp_path) as stack, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as ada, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as bob:
        for browser in (ada, bob):
            async with browser.get(stack.base + "/") as page:
                assert COOKIE in page.cookies
        sessions = []
        for http, words in ((ada, "ada-secret-word"), (bob, "bob-secret-word"),
                            (stack.http, "carol-secret-word")):
            body = {"conversation": "shared", "text": words,
                    "attachments": [{"name": f"{words}.png", "media_type": "image/png",
                                     "data": png}]} if http is ada else {
                        "conversation": "shared", "text": words}
            async with http.post(stack.base + "/api/chat", json=body) as response:
                assert response.status == 200, await response.text()
                sessions.append((await response.json())["session"])
        seen = {}
        for name, http in (("ada", ada), ("bob", bob), ("carol", stack.http)):
            async with http.get(stack.base + "/api/history",
                                params={"conversation": "shared"}) as response:
                assert response.status == 200
                page = await response.json()
            seen[name] = [m["text"] for m in page["messages"] if m["role"] == "user"]
            if name == "ada":
                [digest] = {f["hash"] for m in page["messages"] for f in m["files"]}
        files = {}
        for name, http in (("ada", ada), ("bob", bob), ("carol", stack.http)):
            async with http.get(stack.base + "/api/file",
                                params={"conversation": "shared", "hash": digest}) as response:
                files[name] = response.status
    assert len(set(sessions)) == 3
    assert seen == {"ada": ["ada-secret-word"], "bob": ["bob-secret-word"],
                    "carol": ["carol-secret-word"]}
    assert files == {"ada": 200, "bob": 404, "carol": 404}


def tiny_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(out, "PNG")
    return out.getvalue()


def test_a_conversation_is_named_under_its_person_within_the_name_bound() -> None:
    """``<person>.<id>``; an id too long for that keeps the person and a hash of the id:
    still a valid name, still the person's own, still one name per id."""
    short = own_conversation("c-abc_DEF-12", "chat-1")
    assert short == "c-abc_DEF-12.chat-1"
    longest = "x" * MAX_NAME_LENGTH
    names = {own_conversation(person, conversation)
             for person in ("c-abc_DEF-12", "a-0123456789abcdef")
             for conversation in (longest, longest[:-1] + "y")}
    assert len(names) == 4
    for name in names:
        assert valid_id(name, "conversation") == name
        assert name.split(".", 1)[0] in ("c-abc_DEF-12", "a-0123456789abcdef")

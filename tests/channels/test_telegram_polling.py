"""The Telegram channel end to end in polling mode: the real gateway and PTB against the fake
Bot API, from a user's message to the rendered reply, through the platform's failure modes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.compose import build_gateway
from channels.telegram.render import render_chunks
from channels.telegram.sink import PLACEHOLDER
from providers.offline import OfflineProvider
from sessions.records import MessageDict
from tests.channels.test_telegram_harness import (
    ALICE,
    BOB,
    GROUP_USER,
    channel_of,
    healthz,
    ok_calls,
    replay_of,
    running,
    sessions,
    settled,
    telegram_settings,
    user_texts,
    wait_until,
)
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer
from tests.waiting import WAIT

GROUP = -100123
FORUM = -100555


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def whole(text: str) -> MessageDict:
    """A scripted reply that is not streamed (no preview): the final goes out as sendMessage."""
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


async def test_polling_round_trip(fake: FakeTelegramServer, tmp_path: Path) -> None:
    """A DM is recorded, answered (typing, a placeholder noted in the log, then edited into
    the preview and into the HTML final) and its update acknowledged."""
    provider = ScriptedProvider()
    provider.script("Hello **Alice**")
    async with running(telegram_settings(fake, tmp_path), provider, edit_interval=0) as gateway:
        update = fake.user_message(ALICE, "hi there")
        await settled(gateway, 1)
        await wait_until(lambda: fake.confirmed_offset == update["update_id"] + 1)
        assert await sessions(gateway) == [(f"telegram:{ALICE}", "hi there")]
    assert [c.method for c in fake.sent] == ["getMe", "setMyCommands", "setMyCommands",
                                             "sendChatAction",
                                             "sendMessage", "editMessageText",
                                             "editMessageText"]
    placeholder, preview, final = fake.sent[4:7]
    assert placeholder.text == PLACEHOLDER
    assert (preview.text, preview.params.get("parse_mode")) == ("Hello **Alice**", None)
    assert (final.text, final.params["parse_mode"]) == ("Hello <b>Alice</b>", "HTML")
    [message] = fake.messages_to(ALICE)
    assert message["text"] == "Hello Alice"
    assert message["entities"] == [{"type": "bold", "offset": 6, "length": 5}]
    assert "reply_to_message" not in message  # DMs are not threaded


async def test_fast_reply_sent_once_without_preview(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A reply complete within the edit interval shows no preview: its placeholder (noted in
    the log before any text goes in) is edited once, into the HTML final."""
    provider = ScriptedProvider()
    provider.script("Quick **one**")
    # An interval no turn outlasts, however busy the machine (with the default 1 s a starved
    # run showed a preview: the reply was not "fast" any more).
    async with running(telegram_settings(fake, tmp_path), provider,
                       edit_interval=3600) as gateway:
        fake.user_message(ALICE, "hi")
        await settled(gateway, 1)
    assert [c.method for c in fake.sent] == ["getMe", "setMyCommands", "setMyCommands",
                                             "sendChatAction",
                                             "sendMessage", "editMessageText"]
    assert (fake.sent[4].text, fake.sent[5].params["parse_mode"]) == (PLACEHOLDER, "HTML")
    assert fake.texts_to(ALICE) == ["Quick one"]


async def test_streaming_edits_are_throttled(fake: FakeTelegramServer, tmp_path: Path) -> None:
    """A streamed reply is a plain preview edited at most every interval, then made final."""
    words = " ".join(f"word{i}" for i in range(40))
    async with running(telegram_settings(fake, tmp_path), OfflineProvider(delay=0.03),
                       edit_interval=0.15) as gateway:
        fake.user_message(ALICE, words)
        await settled(gateway, 1)
    [message] = fake.messages_to(ALICE)
    assert f'(offline mode). You said: "{words}"' in message["text"]
    assert message["text"].endswith("I can see 1 message.")
    edits = fake.calls("editMessageText")
    final = [c for c in edits if c.params.get("parse_mode") == "HTML"]
    previews = [fake.calls("sendMessage")[0], *(c for c in edits if c not in final)]
    # The spacing of the edits is proven with a fake clock in tests/channels/test_streaming.py;
    # times seen here carry the machine's scheduling jitter, so only the shape is checked.
    assert len(previews) >= 2
    assert all(c.ok and c.params.get("parse_mode") is None for c in previews)
    if final:  # made final by one HTML edit, the last one
        assert final == edits[-1:]
    else:  # the last preview already showed exactly the final text (it caught up with the
        # whole reply on a busy machine), so no final edit was needed
        assert edits[-1].params["text"] == message["text"]


async def test_long_markdown_reply_split_into_valid_chunks(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A 9,000-character reply becomes valid HTML chunks <= 4096, the code block reopened."""
    code = "\n".join(f"print('line {i:04d}')  # " + "x" * 40 for i in range(145))
    reply = "Here is the script:\n\n```python\n" + code + "\n```\n\nRun it with **care**."
    assert 9_000 <= len(reply) <= 9_500
    provider = ScriptedProvider()
    provider.script(reply)
    async with running(telegram_settings(fake, tmp_path), provider, edit_interval=0) as gateway:
        fake.user_message(ALICE, "write me a script")
        await settled(gateway, 1)
    chunks = render_chunks(reply)
    assert len(chunks) == 3
    assert all(c.ok for c in fake.sent)
    # The preview (cut at 3,500 characters) became the first chunk; each of the others is a
    # placeholder of its own, noted, then edited.
    assert [(c.method, c.text == PLACEHOLDER) for c in fake.sent[4:]] == [
        ("sendMessage", True), ("editMessageText", False), ("editMessageText", False),
        ("sendMessage", True), ("editMessageText", False),
        ("sendMessage", True), ("editMessageText", False)]
    assert fake.texts_to(ALICE) == [c.plain for c in chunks]
    pres = [[e for e in m.get("entities", []) if e["type"] == "pre"]
            for m in fake.messages_to(ALICE)]
    assert all(p and p[0].get("language") == "python" for p in pres)
    assert pres[1][0]["offset"] == 0  # the continued block opens the second chunk
    assert fake.texts_to(ALICE)[-1].endswith("Run it with care.")


async def test_unparseable_html_falls_back_to_plain_text(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """"can't parse entities" on a final edit (an answer) or a final send (a command's
    reply, which no log entry places) is retried once as plain text."""
    provider = ScriptedProvider()
    provider.script(whole("Some **bold** words"))
    parse_error = "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 5"
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.fail_next("editMessageText", 400, parse_error)
        fake.user_message(ALICE, "one")
        await settled(gateway, 1)
        fake.fail_next("sendMessage", 400, parse_error)
        fake.user_message(ALICE, "/help")
        await fake.wait_for_sent(lambda c: c.method == "sendMessage" and c.ok
                                 and c.text != PLACEHOLDER)
    texts = fake.texts_to(ALICE)
    assert len(texts) == 2
    assert texts[0] == "Some bold words"
    assert "/new" in texts[1]
    sends = fake.calls("sendMessage")
    assert [(c.error_code, c.params.get("parse_mode")) for c in sends] == [
        (None, None), (400, "HTML"), (None, None)]
    edits = fake.calls("editMessageText")
    assert [(c.error_code, c.params.get("parse_mode")) for c in edits] == [
        (400, "HTML"), (None, None)]
    assert all("entities" not in m for m in fake.messages_to(ALICE))


@pytest.mark.parametrize("rate_limit", ["off", "on"])
async def test_flood_wait_honoured(fake: FakeTelegramServer, tmp_path: Path,
                                   rate_limit: str) -> None:
    """A 429 retry_after=1 is waited out (by us or AIORateLimiter): the resend is >= 1 s later."""
    provider = ScriptedProvider()
    provider.script(whole("after the flood"))
    settings = telegram_settings(fake, tmp_path, TELEGRAM_RATE_LIMIT=rate_limit)
    async with running(settings, provider) as gateway:
        fake.fail_next("sendMessage", 429, retry_after=1)
        fake.user_message(ALICE, "hello")
        await settled(gateway, 1)
    first, second = fake.calls("sendMessage")
    assert (first.error_code, second.error_code) == (429, None)
    assert second.time - first.time >= 1.0
    assert fake.texts_to(ALICE) == ["after the flood"]


async def test_network_errors_retried_with_backoff(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A 502 on getUpdates is a network error: shown in health, retried, then recovered."""
    async with running(telegram_settings(fake, tmp_path)) as gateway:
        fake.fail_next("getUpdates", 502)
        await wait_until(lambda: channel_of(gateway).health()["last_error"] == "network")
        await wait_until(lambda: channel_of(gateway).health()["ok"], timeout=WAIT)
        fake.user_message(ALICE, "hello")
        await settled(gateway, 1)
    assert fake.texts_to(ALICE) == ["ok"]


async def test_too_long_message_refused_with_notice(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A DM over GATEWAY_MAX_MESSAGE_CHARS gets a short notice and leaves no session."""
    settings = telegram_settings(fake, tmp_path, GATEWAY_MAX_MESSAGE_CHARS=20)
    async with running(settings) as gateway:
        fake.user_message(ALICE, "x" * 21)
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 1)
        fake.user_message(ALICE, "short")
        await settled(gateway, 1)
        assert await sessions(gateway) == [(f"telegram:{ALICE}", "short")]
    assert fake.texts_to(ALICE) == [
        "Sorry, that message is too long (21 characters; the limit is 20). "
        "Please send a shorter one.", "ok"]


async def test_conflict_shown_in_health_then_recovered(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """409 Conflict on getUpdates makes /healthz 503 with the count; polling then recovers."""
    async with running(telegram_settings(fake, tmp_path)) as gateway:
        fake.fail_next("getUpdates", 409, times=2)
        await wait_until(lambda: channel_of(gateway).health()["conflicts"] >= 1)
        status, health = await healthz(gateway)
        assert (status, health["ok"], health["last_error"]) == (503, False, "conflict")
        await wait_until(lambda: channel_of(gateway).health()["ok"], timeout=WAIT)
        status, health = await healthz(gateway)
        assert (status, health["ok"], health["conflicts"]) == (200, True, 2)
        fake.user_message(ALICE, "still there?")
        await settled(gateway, 1)
    assert fake.texts_to(ALICE) == ["ok"]
    assert not fake.calls("deleteWebhook")  # a conflict is reported, never "fixed" silently


async def test_stall_watchdog_restarts_a_hung_poll(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A getUpdates that hangs past TELEGRAM_STALL_SECONDS is cancelled, counted and reissued."""
    # The harness's polls last 1 s: a watchdog at 1.5 s left the other cycles half a second,
    # and a starved run counted a second stall. At 3 s they have two.
    settings = telegram_settings(fake, tmp_path, TELEGRAM_STALL_SECONDS=3)
    async with running(settings) as gateway:
        fake.delay_next("getUpdates", 30)
        await wait_until(lambda: channel_of(gateway).health()["stalls"] == 1, timeout=WAIT)
        fake.user_message(ALICE, "are you awake?")
        await settled(gateway, 1)
        health = channel_of(gateway).health()
    assert fake.texts_to(ALICE) == ["ok"]
    assert (health["ok"], health["stalls"], health["last_error"]) == (True, 1, "stall")


async def test_group_answers_only_when_mentioned(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """Unmentioned group messages get no reply or session; mentions and replies to the bot do."""
    provider = ScriptedProvider()
    provider.script("first", "second")
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.user_message(GROUP, "just chatting", chat_type="supergroup")
        mention = fake.user_message(GROUP, "@fake_test_bot hello", chat_type="supergroup")
        await settled(gateway, 1)
        fake.user_message(GROUP, "unrelated again", chat_type="supergroup")
        fake.user_message(GROUP, "and you?", chat_type="supergroup", reply_to_bot=True)
        await settled(gateway, 2)
        replay = await replay_of(gateway, f"telegram:{GROUP}")
        speaker = f"[Test ({GROUP_USER})]"  # a group: each message names who wrote it
        assert await sessions(gateway) == [(f"telegram:{GROUP}", f"{speaker} @fake_test_bot hello")]
    assert user_texts(replay) == [f"{speaker} @fake_test_bot hello", f"{speaker} and you?"]
    messages = fake.messages_to(GROUP)
    assert [m["text"] for m in messages] == ["first", "second"]
    assert messages[0]["reply_to_message"]["message_id"] == mention["message"]["message_id"]


async def test_forum_topics_are_separate_sessions(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """Two forum topics of one group are two conversations, each answered in its topic."""
    provider = ScriptedProvider()
    provider.script("in eleven", "in twenty-two")
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.user_message(FORUM, "@fake_test_bot one", chat_type="supergroup",
                          message_thread_id=11)
        await settled(gateway, 1)
        fake.user_message(FORUM, "@fake_test_bot two", chat_type="supergroup",
                          message_thread_id=22)
        await settled(gateway, 2)
        speaker = f"[Test ({GROUP_USER})]"
        assert await sessions(gateway) == [
            (f"telegram:{FORUM}:11", f"{speaker} @fake_test_bot one"),
            (f"telegram:{FORUM}:22", f"{speaker} @fake_test_bot two")]
    assert [(m["text"], m["message_thread_id"]) for m in fake.messages_to(FORUM)] == [
        ("in eleven", 11), ("in twenty-two", 22)]
    actions = [c.params.get("message_thread_id") for c in ok_calls(fake, "sendChatAction")]
    assert actions == [11, 22]


async def test_redelivered_update_after_restart_not_answered_twice(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """An update seen before a restart and delivered again afterwards is dropped."""
    provider = ScriptedProvider()
    provider.script("one", "two")
    settings = telegram_settings(fake, tmp_path)
    async with running(settings, provider) as gateway:
        first = fake.user_message(BOB, "first")
        await settled(gateway, 1)
    async with running(settings, provider) as gateway:
        fake.push_update(first)  # as after a crash before the offset was confirmed
        fake.user_message(BOB, "second")
        await settled(gateway, 1)
        replay = await replay_of(gateway, f"telegram:{BOB}")
        dropped = channel_of(gateway).metrics.registry.get_sample_value(
            "gateway_duplicates_dropped_total", {"channel": "telegram"})
    assert user_texts(replay) == ["first", "second"]
    assert fake.texts_to(BOB) == ["one", "two"]
    assert dropped == 1
    assert (tmp_path / "state" / "delivery.jsonl").exists()  # the owed journal remembers it


async def test_a_turn_reaches_its_provider_before_the_next_poll_is_built(
    fake: FakeTelegramServer, tmp_path: Path,
) -> None:
    """After handling a batch, the poller yields once before building the next getUpdates, so
    the turns it started send their provider requests first (the person's answer is what
    waits; the next poll only acknowledges). The order is the event loop's, not a timing."""
    events: list[str] = []

    class Noted(ScriptedProvider):
        async def complete(self, request: Any, on_text: Any = None) -> Any:
            events.append("provider")
            return await super().complete(request, on_text)

    provider = Noted()
    provider.script(whole("one"), whole("two"))
    # Typing as in `gateway run` (after a delay), not at once as elsewhere in these tests.
    # A long poll that cannot time out between the two messages (that would add a poll).
    settings = telegram_settings(fake, tmp_path, GATEWAY_TYPING_DELAY=5,
                                 TELEGRAM_POLL_TIMEOUT=30, TELEGRAM_STALL_SECONDS=60)
    gateway = build_gateway(settings, provider=provider)
    channel_of(gateway).poll_observers.append(lambda: events.append("poll"))
    await gateway.start()
    try:
        fake.user_message(ALICE, "hi")  # the first turn loads the persona (a thread hop)
        await settled(gateway, 1)
        # The first poll brought "hi"; the second is waiting and will bring the next one.
        await wait_until(lambda: events.count("poll") == 2)
        del events[:]
        fake.user_message(ALICE, "and again")
        await settled(gateway, 2)
    finally:
        await gateway.aclose()
    assert events[:2] == ["provider", "poll"], events

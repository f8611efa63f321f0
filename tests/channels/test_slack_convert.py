"""Pure conversion of Slack event envelopes into Inbound messages (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from channels.slack.convert import (
    TRUNCATED,
    Ignored,
    SlackFile,
    clean_text,
    files_of,
    from_slash_command,
    to_inbound,
)
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender

BOT = "U0BOT"
TEAM = "T123"


def envelope(**event: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"type": "message", "user": "U1", "text": "hi", "ts": "10.000100",
                            "channel": "D1", "channel_type": "im", "team": TEAM}
    base.update(event)
    return {"type": "event_callback", "team_id": TEAM, "event": base}


def convert(body: dict[str, Any], **kwargs: Any) -> Inbound | Ignored:
    return to_inbound(body, bot_user_id=BOT, **kwargs)


def test_dm_is_private_conversation_of_the_dm() -> None:
    """A top-level DM keys on the DM channel, no thread; replies go under its ts."""
    assert convert(envelope(), received_at=5.0) == Inbound(
        key=ConversationKey("slack", "D1", TEAM, None), sender=Sender("U1"), text="hi",
        platform_id=f"{TEAM}:D1:10.000100", chat_type="private", received_at=5.0,
        meta={"ts": "10.000100", "thread_ts": "10.000100"},
    )


def test_dm_in_a_thread_is_that_thread() -> None:
    """A DM written in a thread is the thread's conversation and is answered there."""
    result = convert(envelope(thread_ts="9.000001"))
    assert isinstance(result, Inbound)
    assert result.key.thread == "9.000001"
    assert result.meta["thread_ts"] == "9.000001"


def test_mention_twins_convert_identically() -> None:
    """app_mention and its message twin give the same Inbound: key, text and platform id."""
    text = f"<@{BOT}> what's new?"
    mention = envelope(type="app_mention", channel="C1", text=text)
    del mention["event"]["channel_type"]
    twin = envelope(channel="C1", channel_type="channel", text=text)
    first, second = convert(mention), convert(twin)
    assert first == second
    assert isinstance(first, Inbound)
    assert first.key == ConversationKey("slack", "C1", TEAM, "10.000100")
    assert (first.text, first.chat_type, first.platform_id) == (
        "what's new?", "channel", f"{TEAM}:C1:10.000100")


def test_mention_in_thread_keys_on_thread() -> None:
    """A mention inside a thread belongs to that thread's conversation."""
    result = convert(envelope(type="app_mention", channel="C1", thread_ts="9.5",
                              text=f"<@{BOT}> more"))
    assert isinstance(result, Inbound)
    assert (result.key.thread, result.meta["thread_ts"], result.meta["ts"]) == (
        "9.5", "9.5", "10.000100")


@pytest.mark.parametrize(("event", "reason"), [
    ({"bot_id": "B1"}, "bot message"),
    ({"user": BOT}, "own message"),
    ({"subtype": "message_changed"}, "subtype message_changed"),
    ({"subtype": "bot_message", "user": None}, "subtype bot_message"),
    ({"user": None}, "no user"),
    ({"channel": "C1", "channel_type": "channel"}, "channel message without a mention"),
    ({"text": f"<@{BOT}>"}, "empty text"),
    ({"type": "reaction_added"}, "event type reaction_added"),
    ({"ts": None}, "no channel or ts"),
])
def test_not_for_the_bot(event: dict[str, Any], reason: str) -> None:
    """Bot messages, edits, unaddressed channel chatter and empty texts are ignored, with why."""
    assert convert(envelope(**event)) == Ignored(reason)


def test_bad_team_id_ignored() -> None:
    """A team id that is not a safe tenant name never reaches the store."""
    body = envelope()
    body["team_id"] = "../etc"
    assert convert(body) == Ignored("no valid team id")


@pytest.mark.parametrize("team", ["default", "web", "t123", "T", "X123", "T" + "1" * 32])
def test_a_team_id_not_shaped_like_slacks_is_ignored(team: str) -> None:
    """A team id must look like Slack's (``T``/``E`` and capitals or digits): an event or a
    slash command naming ``default`` or ``web`` never lands in those tenants."""
    body = envelope(team=team)
    body["team_id"] = team
    command = from_slash_command({"team_id": team, "channel_id": "D1", "user_id": "U1",
                                  "channel_name": "directmessage", "text": "new"})
    assert (convert(body), command.inbound) == (Ignored("no valid team id"), None)


def test_envelope_team_wins_over_event_team() -> None:
    """In a shared channel the event's team is the author's; the tenant is the installing team."""
    result = convert(envelope(team="T999"))
    assert isinstance(result, Inbound)
    assert result.key.tenant == TEAM


def test_subtypes_of_people_writing_are_kept() -> None:
    """file_share and thread_broadcast messages are still a person talking to us."""
    kinds = [convert(envelope(subtype=s)) for s in ("file_share", "thread_broadcast")]
    assert all(isinstance(k, Inbound) for k in kinds)


def test_long_text_truncated() -> None:
    """Text over the limit is cut to it, with a marker."""
    result = convert(envelope(text="x" * 50), max_chars=30)
    assert isinstance(result, Inbound)
    assert result.text == "x" * (30 - len(TRUNCATED)) + TRUNCATED
    assert len(result.text) == 30


@pytest.mark.parametrize(("wire", "text"), [
    (f"<@{BOT}> hello", "hello"),
    (f"hey <@{BOT}> there", "hey there"),
    (f"hey <@{BOT}|bot>", "hey"),
    ("ask <@U2>", "ask <@U2>"),
    ("see <https://example.com|the site> and <https://a.io>",
     "see the site (https://example.com) and https://a.io"),
    ("mail <mailto:a@b.io|a@b.io>", "mail a@b.io"),
    ("in <#C1|general> <!here>", "in #general @here"),
    ("1 &lt; 2 &amp;&amp; 3 &gt; 2", "1 < 2 && 3 > 2"),
    ("&lt;@U2&gt; is text", "<@U2> is text"),
    ("bell\x07 tab\there\nnext", "bell tab\there\nnext"),
])
def test_clean_text(wire: str, text: str) -> None:
    """Slack's wire text reads as plain text: our mention gone, links and escapes resolved."""
    assert clean_text(wire, BOT) == text


def slack_file(**fields: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "id": "F1", "name": "cat.jpg", "mimetype": "image/jpeg", "size": 1200, "mode": "hosted",
        "url_private": "https://files.slack.com/files-pri/T123-F1/cat.jpg",
        "url_private_download": "https://files.slack.com/files-pri/T123-F1/download/cat.jpg"}
    found.update(fields)
    return found


def test_a_file_without_text_is_a_message() -> None:
    """A DM that only shares a file counts, with empty text; without files it would not."""
    result = convert(envelope(text="", subtype="file_share", files=[slack_file()]))
    assert isinstance(result, Inbound)
    assert result.text == ""
    assert convert(envelope(text="")) == Ignored("empty text")


def test_files_of_decides_what_to_download() -> None:
    """Hosted files within the limit are downloaded from url_private_download; too large,
    external or deleted ones, and any URL the token must not reach, are refused by kind."""
    wanted = files_of({"files": [
        slack_file(),
        slack_file(name="big.mov", size=5000),
        slack_file(name="gdoc", mode="external"),
        slack_file(name="gone", mode="tombstone"),
        slack_file(name="evil.png", url_private_download="https://evil.example/x.png"),
        slack_file(name="clip.mp4", subtype="slack_audio", mimetype="audio/mp4"),
        "not a file",
    ]}, max_bytes=2000, api_base_url=None)
    assert wanted == [
        SlackFile("https://files.slack.com/files-pri/T123-F1/download/cat.jpg", "cat.jpg",
                  "image/jpeg", "file", 1200),
        Attachment("big.mov", "image/jpeg", size=5000, problem="too-large"),
        Attachment("gdoc", "image/jpeg", size=1200, problem="unavailable"),
        Attachment("gone", "image/jpeg", size=1200, problem="unavailable"),
        Attachment("evil.png", "image/jpeg", size=1200, problem="download-failed"),
        SlackFile("https://files.slack.com/files-pri/T123-F1/download/cat.jpg", "clip.mp4",
                  "audio/mp4", "voice", 1200),
    ]

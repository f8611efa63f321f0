"""``/forget`` in a chat and the speaker attribution of group messages, through the composed
gateway (composition root, router, registry, persona, offline provider) over a memory channel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.delivery.speakers import attribution, user_message
from gateway.edge.commands import FORGET, arguments, parse
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.erasure.forget import GROUP_REPLY
from sessions.replay import replay_bytes
from tests.fakes.memory_channel import MemoryChannel


@asynccontextmanager
async def composed(tmp_path: Path) -> AsyncIterator[tuple[Gateway, MemoryChannel]]:
    settings = Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path / "data"),  # type: ignore[call-arg]
                        GATEWAY_PORT=0)
    channel = MemoryChannel()
    gateway = build_gateway(settings, channels=[channel])
    await gateway.start()
    try:
        yield gateway, channel
    finally:
        await gateway.aclose()


async def said(channel: MemoryChannel, chat: str, text: str, **kw: str) -> str:
    """Say ``text`` and return the reply it got."""
    count = len(channel.replies)
    await channel.say(chat, text, **kw)
    return (await channel.wait_replies(count + 1))[count][2]


async def conversations(gateway: Gateway) -> list[str | None]:
    return sorted(info.conversation for info in await gateway.store.list_sessions("default"))


def test_forget_is_a_command_with_arguments() -> None:
    """/forget and /forget@bot are the forget command; its words after it are its arguments."""
    assert parse("/forget") is FORGET
    assert parse("  /Forget@my_bot   confirm  now ") is FORGET
    assert arguments("  /Forget@my_bot   confirm  now ") == "confirm now"
    assert parse("forget me") is None


def test_group_messages_name_their_speaker_and_names_cannot_forge_the_frame() -> None:
    """A shared chat's user message starts with [name (id)]; a DM's is the text as typed."""
    group = Inbound(ConversationKey("telegram", "-100"), Sender("1001", "Ada Lovelace"), "hi",
                    chat_type="supergroup")
    assert user_message(group) == {"role": "user", "content": "[Ada Lovelace (1001)] hi"}
    dm = Inbound(ConversationKey("telegram", "1001"), Sender("1001", "Ada"), "hi")
    assert user_message(dm) == {"role": "user", "content": "hi"}
    assert attribution(Sender("U1")) == "[U1]"
    assert attribution(Sender("U1", "Eve] [Bob (U2)\n")) == "[Eve Bob U2 (U1)]"


async def test_forget_asks_then_erases_only_that_persons_direct_data(tmp_path: Path) -> None:
    """/forget asks first; /forget confirm erases the person's memory and DM sessions (and
    closes the open one); their group keeps its log with a marker in their message's place
    (replay says its calls are erased), and other people keep everything."""
    async with composed(tmp_path) as (gateway, channel):
        await said(channel, "lovelace", "remember that I like green tea", sender="lovelace")
        await said(channel, "team", "remember that the demo is friday", sender="lovelace",
                   chat_type="group", name="Ada")
        await said(channel, "babbage", "remember that I like coffee", sender="babbage")
        before = await conversations(gateway)
        assert before == ["memory:babbage", "memory:lovelace", "memory:team"]

        ask = await said(channel, "lovelace", "/forget", sender="lovelace")
        assert ask.startswith("This erases, for good,")
        assert "(1 saved conversation)" in ask
        assert await conversations(gateway) == before  # asking changes nothing
        group = await said(channel, "team", "/forget confirm", sender="lovelace",
                           chat_type="group")
        assert group == GROUP_REPLY
        done = await said(channel, "lovelace", "/forget confirm", sender="lovelace")
        assert done == ("Done: I erased what I remembered about you (2 files) and 1 "
                        "conversation. We start from scratch.")
        assert await conversations(gateway) == ["memory:babbage", "memory:team"]
        assert len(await gateway.store.tombstones("default")) == 1

        reply = await said(channel, "lovelace", "hello again", sender="lovelace")
        assert "green tea" not in reply
        infos = await gateway.store.list_sessions("default")
        fresh = next(i for i in infos if i.conversation == "memory:lovelace")
        replay = replay_bytes(await gateway.store.read_log("default", fresh.session_id))
        turn = replay.call(1)
        assert turn.prompt is not None
        assert "green tea" not in turn.prompt.text  # a new session, and no memory left
        assert [m["content"] for m in replay.sent(turn)] == ["hello again"]
        team = next(i for i in infos if i.conversation == "memory:team")
        log = await gateway.store.read_log("default", team.session_id)
        assert b"[Ada (lovelace)]" not in log
        assert b"remember that the demo" not in log
        group_replay = replay_bytes(log)
        assert group_replay.messages.entry(0)["message"] == {"role": "user",
                                                             "content": "[erased]"}
        assert group_replay.call(1).status == "erased"
        assert b"friday" in log  # what the model said and saved there stays the group's
        babbage = next(i for i in infos if i.conversation == "memory:babbage")
        assert b"coffee" in await gateway.store.read_log("default", babbage.session_id)


@pytest.mark.parametrize("text", ["/forget", "/forget confirm"])
async def test_commands_are_never_recorded(tmp_path: Path, text: str) -> None:
    """A command never becomes a message of the session (nor reaches the provider)."""
    async with composed(tmp_path) as (gateway, channel):
        await said(channel, "x", "hello", sender="x")
        session = (await gateway.store.list_sessions("default"))[0].session_id
        before = await gateway.store.read_log("default", session)
        await said(channel, "x", text.replace("confirm", "maybe"), sender="x")
        assert await gateway.store.read_log("default", session) == before

"""Slack files are downloaded after the acknowledgement, as the message's turn starts: the real
gateway, bolt and slack_sdk against the fake Slack, whose file host holds downloads until the
test lets them go (no timing: what happened while one was held is looked at, then released).
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import orjson

from app.compose import build_gateway
from sessions.replay import replay_bytes
from tests.channels.test_slack_gateway import (
    TEAM,
    events_url,
    running,
    slack_settings,
    thread_texts,
    turns,
    wait_until,
)
from tests.fakes import media
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.waiting import WAIT

PHOTO = media.jpeg(320, 240)
ACK_BOUND = 10.0
"""Seconds a test waits for an acknowledgement while a download is held: only ends a failing
run (an acknowledgement that waits for the download never comes); Slack's own limit is 3 s."""


def image_of(body: dict[str, object]) -> list[str]:
    """The base64 data of the image blocks in a request body's last message."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return [block["source"]["data"] for block in messages[-1]["content"]
            if isinstance(block, dict) and block.get("type") == "image"]


def owed_lines(data_dir: Path) -> list[list[object]]:
    """The owed journal's lines."""
    path = data_dir / "state" / "delivery.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


async def test_event_is_acknowledged_before_its_file_is_downloaded(tmp_path: Path) -> None:
    """A message with a file gets its 200 while Slack's file host still holds the download
    (before the fix the acknowledgement waited for it, past Slack's 3 s, and Slack retried);
    the download runs as the turn starts, and the answer uses the file."""
    provider = ScriptedProvider()
    provider.script("A cat.")
    async with FakeSlackServer() as slack, running(slack_settings(slack, tmp_path),
                                                   provider) as gateway:
        slack.downloads.close()
        hosted = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted], "what is this?")
        ack = await slack.deliver_event(events_url(gateway), envelope, timeout=ACK_BOUND)
        await wait_until(lambda: slack.downloads.waiting == 1)  # after the ack, still held
        while_held = (turns(gateway), list(slack.files_served), len(provider.bodies),
                      [i.message_count for i in await gateway.store.list_sessions(TEAM)])
        slack.downloads.open()
        await wait_until(lambda: turns(gateway) == 1)
        [info] = await gateway.store.list_sessions(TEAM)
        log = replay_bytes(await gateway.store.read_log(TEAM, info.session_id))
    assert ack == (200, "")
    assert while_held == (0, [], 0, [0])  # owed in the journal only: not in its session yet
    [body] = provider.bodies
    assert image_of(body) == [base64.b64encode(PHOTO).decode()]
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["A cat."]
    [user] = [m for m in log.messages if m["role"] == "user"]
    assert [b["type"] for b in user["content"]] == ["attachment", "text"]
    assert len(slack.deliveries) == 1  # no retry was needed


async def test_a_stop_after_the_ack_leaves_the_file_owed_for_the_next_start(
        tmp_path: Path) -> None:
    """Stopped after the acknowledgement, with the download still held: the owed journal
    keeps the file's reference (never its bytes), and the next start downloads it and
    answers with it, once."""
    first_provider, second_provider = ScriptedProvider(), ScriptedProvider()
    second_provider.script("A cat, after the restart.")
    async with FakeSlackServer() as slack:
        settings = slack_settings(slack, tmp_path, GATEWAY_SHUTDOWN_GRACE=0)
        hosted = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted], "and this?")
        slack.downloads.close()
        async with running(settings, first_provider) as first:
            ack = await slack.deliver_event(events_url(first), envelope, timeout=ACK_BOUND)
            await wait_until(lambda: slack.downloads.waiting == 1)
        owed = [line for line in owed_lines(tmp_path) if line[0] == "owe"]
        slack.downloads.drop()  # the first run's request never got its file
        async with running(settings, second_provider) as second:
            await wait_until(lambda: turns(second) == 1)
            [info] = await second.store.list_sessions(TEAM)
            log = replay_bytes(await second.store.read_log(TEAM, info.session_id))
    assert ack == (200, "")
    assert first_provider.bodies == []
    [(_, _, _, _, _, item)] = owed
    assert isinstance(item, str)
    wire = orjson.loads(item.partition(" ")[2])
    assert wire["attachments"] == [{
        "name": "cat.jpg", "media_type": "image/jpeg", "kind": "file", "size": len(PHOTO),
        "problem": None, "ref": {"url": hosted["url_private_download"]}}]
    [body] = second_provider.bodies
    assert image_of(body) == [base64.b64encode(PHOTO).decode()]
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["A cat, after the restart."]
    assert [m["role"] for m in log.messages] == ["user", "assistant"]  # recorded once
    path = hosted["url_private_download"].split("/files-pri/", 1)[1]
    assert slack.files_served == [path]


async def test_a_download_failing_after_the_ack_is_told(tmp_path: Path) -> None:
    """A download that fails after the acknowledgement (the file host errs) is not silence:
    the reply says the file could not be downloaded, then answers the text."""
    async with FakeSlackServer() as slack, running(slack_settings(slack, tmp_path)) as gateway:
        slack.downloads.close()
        hosted = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted], "look")
        ack = await slack.deliver_event(events_url(gateway), envelope, timeout=ACK_BOUND)
        await wait_until(lambda: slack.downloads.waiting == 1)
        slack.downloads.drop()  # answered 502
        await wait_until(lambda: turns(gateway) == 1)
    assert ack == (200, "")
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == [
        "I couldn't use cat.jpg: it could not be downloaded.\n\nok"]


async def test_socket_mode_acks_before_the_download(tmp_path: Path) -> None:
    """Over Socket Mode too, the envelope is acknowledged while the download is held."""
    async with FakeSlackServer() as slack:
        settings = slack_settings(slack, tmp_path, SLACK_APP_TOKEN=slack.app_token,
                                  SLACK_SIGNING_SECRET=None)
        async with running(settings) as gateway:
            await asyncio.wait_for(slack.socket_connected.wait(), WAIT)
            slack.downloads.close()
            hosted = slack.add_file(media.PDF, "q3.pdf", "application/pdf")
            envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted], "sum up")
            envelope_id = await slack.socket_send_event(envelope)
            ack = await slack.wait_for_ack(envelope_id, timeout=ACK_BOUND)
            await wait_until(lambda: slack.downloads.waiting == 1)
            served_while_held = list(slack.files_served)
            slack.downloads.open()
            await wait_until(lambda: turns(gateway) == 1)
    assert ack == {"envelope_id": envelope_id}
    assert served_while_held == []
    assert len(slack.files_served) == 1
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["ok"]


class CountingTranscriber:
    """Speech to text that counts its calls (each one a paid request in production)."""

    model = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def transcribe(self, audio: bytes, media_type: str, name: str) -> str:
        self.calls.append(name)
        return f"the words in {name}"

    async def aclose(self) -> None:
        return None


async def test_a_retried_event_never_downloads_or_transcribes_again(tmp_path: Path) -> None:
    """Slack retries an event (``X-Slack-Retry-Num``) while its voice note is still being
    fetched: the retry is answered 200 at once (the owed journal has it), and the file is
    downloaded once, transcribed once and answered once."""
    provider = ScriptedProvider()
    provider.script("Heard you.")
    transcriber = CountingTranscriber()
    async with FakeSlackServer() as slack:
        gateway = build_gateway(slack_settings(slack, tmp_path), provider=provider,
                                transcriber=transcriber)
        await gateway.start()
        try:
            slack.downloads.close()
            hosted = slack.add_file(media.OGG_VOICE, "note.ogg", "audio/ogg")
            envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted])
            first = await slack.deliver_event(events_url(gateway), envelope,
                                              timeout=ACK_BOUND)
            await wait_until(lambda: slack.downloads.waiting == 1)  # its turn fetches it
            retries = [await slack.deliver_event(events_url(gateway), envelope, retry_num=n,
                                                 timeout=ACK_BOUND) for n in (1, 2)]
            slack.downloads.open()
            await wait_until(lambda: turns(gateway) == 1)
            # Another message in the same DM, answered after it: by then a second turn for
            # the retried event would have run (a conversation's turns go in order).
            provider.script("And that.")
            marker = slack.dm_event("U1", "one more")
            await slack.deliver_event(events_url(gateway), marker, timeout=ACK_BOUND)
            await wait_until(lambda: turns(gateway) == 2)
        finally:
            await gateway.aclose()
    assert first == (200, "")
    assert retries == [(200, ""), (200, "")]
    path = hosted["url_private_download"].split("/files-pri/", 1)[1]
    assert slack.files_served == [path]
    assert transcriber.calls == ["note.ogg"]
    assert len(provider.bodies) == 2
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["Heard you."]

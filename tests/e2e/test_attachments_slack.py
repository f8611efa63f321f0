"""Files through Slack end to end: slack-bolt and slack_sdk against the fake Slack (files at
``url_private_download``), the provider SDKs against the fake provider servers. A file-only
message is answered, the body a provider received equals ``gateway replay --request N``, and
the bot token never goes to a host an event names unless it is Slack's."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from channels.slack.convert import token_allowed
from tests.channels.test_slack_gateway import (
    TEAM,
    events_url,
    running,
    slack_settings,
    thread_texts,
    turns,
    wait_until,
)
from tests.e2e.replaying import assert_shows_what_was_read, replay_cli
from tests.e2e.test_provider_replay import API, make_provider
from tests.fakes import media
from tests.fakes.providers import FakeProviderServer, Reply
from tests.fakes.slack_api import FakeSlackServer

PHOTO = media.jpeg(320, 240)


class Elsewhere:
    """A server that is not Slack, recording every request (and any Authorization header)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Elsewhere:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _any(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, request.headers.get("Authorization")))
        return web.Response(body=PHOTO, content_type="image/jpeg")


@pytest.fixture
async def elsewhere() -> AsyncIterator[Elsewhere]:
    async with Elsewhere() as server:
        yield server


@pytest.mark.parametrize("api", API)
async def test_file_only_dm_is_answered_and_replays(tmp_path: Path, api: str) -> None:
    """A photo with no text in a DM is downloaded with the token, answered, and its call
    replays byte-equal; a PDF with a question in a channel mention too."""
    data_dir = tmp_path / "data"
    async with FakeSlackServer() as slack, FakeProviderServer() as srv:
        srv.script(api, Reply.text("A cat on a sofa."), Reply.text("It is the Q3 report."))  # type: ignore[arg-type]
        async with running(slack_settings(slack, data_dir),
                           make_provider(api, srv)) as gateway:
            dm = slack.file_event(slack.im_channel_for("U1"), "U1",
                                  [slack.add_file(PHOTO, "IMG_0042.jpg", "image/jpeg")])
            assert await slack.deliver_event(events_url(gateway), dm) == (200, "")
            await wait_until(lambda: turns(gateway) == 1)
            slack.add_channel("C0FAKEGEN", name="general")
            mention = slack.file_event(
                "C0FAKEGEN", "U2", [slack.add_file(media.PDF, "q3.pdf", "application/pdf")],
                f"<@{slack.bot_user_id}> what does this say?")
            assert (await slack.deliver_event(events_url(gateway), mention))[0] == 200
            await wait_until(lambda: turns(gateway) == 2)
        bodies = [r.body for r in srv.requests_for(api)]
        raws = [r.raw for r in srv.requests_for(api)]
    assert [auth for _, auth in slack.file_downloads] == [f"Bearer {slack.bot_token}"] * 2
    event = dm["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["A cat on a sofa."]
    ts = mention["event"]["ts"]
    assert thread_texts(slack, "C0FAKEGEN", ts) == ["It is the Q3 report."]
    photo = base64.b64encode(PHOTO).decode()
    # (The last block of a call may carry a prompt-cache marker; the image is what matters.)
    first = [{k: v for k, v in block.items() if k != "cache_control"}
             for block in bodies[0]["messages"][-1]["content"]]
    if api == "anthropic":
        assert first == [{"type": "image", "source": {"type": "base64",
                                                      "media_type": "image/jpeg", "data": photo}}]
    else:
        assert first == [{"type": "image_url",
                          "image_url": {"url": f"data:image/jpeg;base64,{photo}"}}]
    code, listing = await asyncio.to_thread(replay_cli, data_dir, "--list", "--json",
                                            "--tenant", TEAM)
    assert code == 0
    replayed = []
    sessions = sorted(orjson.loads(listing), key=lambda s: s["startedAt"])
    for session, body in zip(sessions, bodies, strict=True):
        code, out = await asyncio.to_thread(replay_cli, data_dir, session["id"], "--tenant", TEAM,
                                            "--request", "1", "--shape", api, "--raw")
        assert code == 0
        replayed.append(out.encode())
        assert await asyncio.to_thread(assert_shows_what_was_read, data_dir, session["id"],
                                       tenant=TEAM, received=[body]) == 1
    assert replayed == raws  # byte for byte, the photo's base64 included


async def test_token_never_goes_to_a_host_an_event_names(
    tmp_path: Path, elsewhere: Elsewhere
) -> None:
    """An event whose file URL points at another server: nothing is requested there (so no
    token either), and the person is told the file could not be downloaded."""
    async with FakeSlackServer() as slack, running(
            slack_settings(slack, tmp_path / "data")) as gateway:
        evil = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        for key in ("url_private", "url_private_download"):
            evil[key] = f"http://127.0.0.1:{elsewhere.port}/files-pri/{TEAM}/cat.jpg"
        envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [evil], "look")
        assert (await slack.deliver_event(events_url(gateway), envelope))[0] == 200
        await wait_until(lambda: turns(gateway) == 1)
    assert elsewhere.seen == []
    assert slack.file_downloads == []
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == [
        "I couldn't use cat.jpg: it could not be downloaded.\n\nok"]


@pytest.mark.parametrize(("url", "api_base", "allowed"), [
    ("https://files.slack.com/files-pri/T1-F1/download/a.png", None, True),
    ("https://files.slack.com:443/files-pri/T1-F1/a.png", None, True),
    ("http://files.slack.com/files-pri/T1-F1/a.png", None, False),  # never in clear text
    ("https://files.slack.com.evil.example/a.png", None, False),
    ("https://user@files.slack.com/a.png", None, False),
    ("https://evil.example/files-pri/a.png", None, False),
    ("https://slack.com/files-pri/a.png", None, False),
    ("http://127.0.0.1:9000/files-pri/a.png", "http://127.0.0.1:9000/api/", True),
    ("http://127.0.0.1:9001/files-pri/a.png", "http://127.0.0.1:9000/api/", False),
    ("https://127.0.0.1:9000/a.png", "http://127.0.0.1:9000/api/", False),
    ("http://127.0.0.1:notaport/a.png", "http://127.0.0.1:9000/api/", False),
    ("javascript:alert(1)", "http://127.0.0.1:9000/api/", False),
])
def test_token_allowed(url: str, api_base: str | None, allowed: bool) -> None:
    """Only Slack's file host over HTTPS, or exactly SLACK_API_BASE_URL's scheme, host and
    port, may receive the bot token."""
    assert token_allowed(url, api_base) is allowed


async def test_download_redirect_is_not_followed(tmp_path: Path) -> None:
    """A download answered with a redirect (to wherever) is not followed: one request, with
    the token, to the named URL only; the person is told the file could not be downloaded."""
    async with FakeSlackServer() as slack, running(
            slack_settings(slack, tmp_path / "data")) as gateway:
        hosted = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        path = hosted["url_private_download"].split("/files-pri/", 1)[1]
        slack.moved[path] = "elsewhere/cat.jpg"
        envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted])
        assert (await slack.deliver_event(events_url(gateway), envelope))[0] == 200
        await wait_until(lambda: turns(gateway) == 1)
    assert [p for p, _ in slack.file_downloads] == [path]
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == [
        "I couldn't use cat.jpg: it could not be downloaded."]


async def test_a_strangers_file_is_never_downloaded(tmp_path: Path) -> None:
    """A file from someone not allowed to talk to the agent gets them the pairing code; the
    gateway never downloads it (the bot token never fetches a stranger's upload)."""
    async with FakeSlackServer() as slack, running(
            slack_settings(slack, tmp_path / "data", SLACK_ALLOWED_USERS="")) as gateway:
        hosted = slack.add_file(PHOTO, "cat.jpg", "image/jpeg")
        envelope = slack.file_event(slack.im_channel_for("U9"), "U9", [hosted], text="hi")
        assert (await slack.deliver_event(events_url(gateway), envelope))[0] == 200
        event = envelope["event"]
        await wait_until(lambda: len(thread_texts(slack, event["channel"], event["ts"])) == 1)
        assert turns(gateway) == 0
    [reply] = thread_texts(slack, event["channel"], event["ts"])
    assert "gateway pairing approve" in reply
    assert slack.file_downloads == []


async def test_send_file_is_uploaded_into_the_thread(tmp_path: Path) -> None:
    """send_file on Slack: files upload v2 (upload URL, bytes, completion) into the thread."""
    from tests.fakes.scripted_provider import ScriptedProvider

    provider = ScriptedProvider()
    provider.script({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "send_file",
         "input": {"name": "plan.md", "content": "# Plan\n- ship\n"}}]}, "Uploaded.")
    async with FakeSlackServer() as slack, running(
            slack_settings(slack, tmp_path / "data"), provider) as gateway:
        envelope = slack.dm_event("U1", "write the plan to a file")
        assert (await slack.deliver_event(events_url(gateway), envelope))[0] == 200
        await wait_until(lambda: turns(gateway) == 1)
    event = envelope["event"]
    [shared] = slack.shared_files
    assert (shared["filename"], shared["data"], shared["channel"], shared["thread_ts"]) == (
        "plan.md", b"# Plan\n- ship\n", event["channel"], event["ts"])
    assert thread_texts(slack, event["channel"], event["ts"]) == ["Uploaded."]

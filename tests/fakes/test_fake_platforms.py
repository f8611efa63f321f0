"""The fake Telegram and Slack servers, driven by the real PTB, slack_sdk and slack_bolt."""

from __future__ import annotations

import asyncio
import datetime as dtm
from collections.abc import AsyncIterator

import orjson
import pytest
import telegram
from aiohttp import web
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from telegram.constants import ParseMode
from telegram.error import BadRequest, Conflict, RetryAfter
from telegram.ext import ApplicationBuilder, ContextTypes, MessageHandler, filters

from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer, parse_telegram_html
from tests.waiting import until

CHAT = 5551234


# ------------------------------------------------------------------------- fixtures


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bot(tg: FakeTelegramServer) -> AsyncIterator[telegram.Bot]:
    async with telegram.Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url) as b:
        yield b


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


@pytest.fixture
def web_client(slack: FakeSlackServer) -> AsyncWebClient:
    # retry_handlers=[]: surface 429s instead of letting the SDK retry them.
    return AsyncWebClient(token=slack.bot_token, base_url=slack.api_base_url, retry_handlers=[])


class _Receiver:
    """A tiny aiohttp app on 127.0.0.1 recording what the fakes POST to it."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.received = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> _Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        self.received.set()
        return web.Response(status=self.status, text="ok")


# ------------------------------------------------------------------------- Telegram


async def test_ptb_get_me(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """PTB initialises against the fake and getMe returns the configured bot user."""
    me = await bot.get_me()
    assert me.is_bot
    assert me.username == "fake_test_bot"
    assert me.id == int(tg.token.split(":")[0])
    assert [c.method for c in tg.sent][:1] == ["getMe"]  # from `async with bot`


async def test_ptb_send_message_records_and_replies(
    tg: FakeTelegramServer, bot: telegram.Bot
) -> None:
    """sendMessage returns a full Message with per-chat ids and records reply/thread params."""
    update = tg.user_message(
        -100777, "hello @fake_test_bot", chat_type="supergroup", message_thread_id=9, user_id=31
    )
    user_msg = update["message"]
    assert user_msg["entities"] == [{"type": "mention", "offset": 6, "length": 14}]

    sent = await bot.send_message(
        -100777,
        "hi there",
        reply_parameters=telegram.ReplyParameters(message_id=user_msg["message_id"]),
        message_thread_id=9,
    )
    assert sent.message_id == user_msg["message_id"] + 1
    assert sent.from_user is not None
    assert sent.from_user.is_bot
    assert sent.chat.id == -100777
    assert sent.text == "hi there"
    assert sent.message_thread_id == 9
    assert sent.reply_to_message is not None
    assert sent.reply_to_message.message_id == user_msg["message_id"]

    call = (await tg.wait_for_sent(lambda c: c.method == "sendMessage"))[0]
    assert call.chat_id == -100777
    assert call.text == "hi there"
    assert call.params["message_thread_id"] == 9
    assert call.params["reply_parameters"]["message_id"] == user_msg["message_id"]
    assert tg.texts_to(-100777) == ["hi there"]


async def test_ptb_unknown_chat_is_bad_request(bot: telegram.Bot) -> None:
    """Sending to a chat the bot never saw fails with "chat not found" like the real API."""
    with pytest.raises(BadRequest, match=r"(?i)chat not found"):
        await bot.send_message(999, "hi")


async def test_ptb_html_entities_parsed(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """Valid HTML becomes visible text plus entities with UTF-16 offsets."""
    tg.user_message(CHAT, "start")
    sent = await bot.send_message(
        CHAT,
        '😀 <b>bold &amp; <i>both</i></b> <a href="https://x.test/?a=1&amp;b=2">link</a>\n'
        '<pre><code class="language-python">x = 1 &lt; 2</code></pre>'
        "<blockquote expandable>q</blockquote>",
        parse_mode=ParseMode.HTML,
    )
    assert sent.text == "😀 bold & both link\nx = 1 < 2q"
    as_json = [e.to_dict() for e in sent.entities]
    assert as_json == [
        {"type": "bold", "offset": 3, "length": 11},
        {"type": "italic", "offset": 10, "length": 4},
        {"type": "text_link", "offset": 15, "length": 4, "url": "https://x.test/?a=1&b=2"},
        {"type": "pre", "offset": 20, "length": 9, "language": "python"},
        {"type": "expandable_blockquote", "offset": 29, "length": 1},
    ]


@pytest.mark.parametrize(
    ("markup", "detail"),
    [
        ("<b>open", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("1 <br> 2", 'Unsupported start tag "br" at byte offset 2'),
        ("x < y", 'Unsupported start tag "" at byte offset 2'),
        ("</b>", "Unexpected end tag at byte offset 0"),
        ('<span class="x">s</span>', 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
    ],
)
def test_html_checker_errors_match_tdlib(markup: str, detail: str) -> None:
    """The HTML checker rejects malformed markup with tdlib's error texts."""
    with pytest.raises(ValueError, match="^" + detail.replace("(", r"\(") + "$"):
        parse_telegram_html(markup)


async def test_ptb_bad_html_raises_bad_request(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """Unbalanced HTML makes PTB raise BadRequest "can't parse entities"."""
    tg.user_message(CHAT, "start")
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
        await bot.send_message(CHAT, "<b>unclosed <i>tags</b>", parse_mode=ParseMode.HTML)
    failed = tg.calls("sendMessage")[-1]
    assert failed.error_code == 400
    assert failed.description is not None
    assert failed.description.startswith("Bad Request: can't parse entities: Unmatched end tag")
    assert tg.messages_to(CHAT) == []


async def test_ptb_too_long_counts_visible_utf16(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """The 4096 limit applies to visible UTF-16 text after tag removal."""
    tg.user_message(CHAT, "start")
    ok = await bot.send_message(CHAT, "<b>" + "a" * 4096 + "</b>", parse_mode=ParseMode.HTML)
    assert ok.text is not None
    assert len(ok.text) == 4096
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(CHAT, "😀" * 2049)  # 2049 astral chars = 4098 UTF-16 units


async def test_ptb_retry_after(
    tg: FakeTelegramServer, bot: telegram.Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 with parameters.retry_after raises RetryAfter carrying that delay."""
    # PTB 22 warns when RetryAfter.retry_after is an int; opt in to timedelta.
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    tg.user_message(CHAT, "start")
    tg.fail_next("sendMessage", 429, retry_after=7)
    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(CHAT, "flood")
    assert caught.value.retry_after == dtm.timedelta(seconds=7)
    sent = await bot.send_message(CHAT, "after the flood")  # the fault was one-shot
    assert sent.text == "after the flood"


async def test_ptb_long_poll_and_offset_confirmation(
    tg: FakeTelegramServer, bot: telegram.Bot
) -> None:
    """getUpdates waits for a pushed update, and a higher offset acknowledges it."""
    poll = asyncio.create_task(bot.get_updates(timeout=5))
    await until(lambda: tg.get_updates_active == 1)  # the fake holds the poll open
    assert not poll.done()  # genuinely long-polling
    pushed = tg.user_message(CHAT, "/start", username="alice")
    updates = await asyncio.wait_for(poll, 3)
    assert [u.update_id for u in updates] == [pushed["update_id"]]
    message = updates[0].message
    assert message is not None
    assert message.text == "/start"
    assert message.entities[0].type == "bot_command"

    # Not yet acknowledged: the same update comes again.
    again = await bot.get_updates(timeout=0)
    assert [u.update_id for u in again] == [pushed["update_id"]]
    assert tg.confirmed_offset == 0

    after = await bot.get_updates(offset=pushed["update_id"] + 1, timeout=0)
    assert after == ()
    assert tg.confirmed_offset == pushed["update_id"] + 1
    assert tg.pending_updates == []
    assert tg.get_updates_calls == 3


async def test_ptb_concurrent_polls_conflict(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """A second bot instance polling concurrently terminates the first with 409 Conflict."""
    first = asyncio.create_task(bot.get_updates(timeout=5))
    await until(lambda: tg.get_updates_active == 1)  # the first poll is held open
    # A separate Bot: one Bot's HTTP pool would serialise the two requests.
    async with telegram.Bot(tg.token, base_url=tg.base_url) as other:
        second = asyncio.create_task(other.get_updates(timeout=1))
        with pytest.raises(Conflict, match="terminated by other getUpdates"):
            await asyncio.wait_for(first, 3)
        assert await second == ()


async def test_ptb_conflict_while_webhook_set(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """While a webhook is set getUpdates raises Conflict; deleteWebhook lifts it."""
    assert await bot.set_webhook("https://example.invalid/tg", secret_token="s3cret")
    info = await bot.get_webhook_info()
    assert info.url == "https://example.invalid/tg"
    with pytest.raises(Conflict, match="webhook is active"):
        await bot.get_updates(timeout=0)
    assert await bot.delete_webhook()
    assert await bot.get_updates(timeout=0) == ()


async def test_webhook_push_and_manual_delivery(tg: FakeTelegramServer, bot: telegram.Bot) -> None:
    """Updates are POSTed to the webhook with the secret-token header, auto and by helper."""
    async with _Receiver() as receiver:
        await bot.set_webhook(receiver.url, secret_token="s3cret")
        pushed = tg.user_message(CHAT, "via webhook")
        await asyncio.wait_for(receiver.received.wait(), 3)
        headers, body = receiver.requests[0]
        assert headers["X-Telegram-Bot-Api-Secret-Token"] == "s3cret"
        assert orjson.loads(body) == pushed
        await until(lambda: not tg.pending_updates)  # removed right after the 2xx answer

        status, _ = await tg.deliver_webhook(receiver.url, {"message": pushed["message"]}, "x")
        assert status == 200
        assert receiver.requests[1][0]["X-Telegram-Bot-Api-Secret-Token"] == "x"
        await bot.delete_webhook()


async def test_ptb_edit_delete_action_commands_chat(
    tg: FakeTelegramServer, bot: telegram.Bot
) -> None:
    """editMessageText, deleteMessage, sendChatAction, setMyCommands and getChat behave."""
    tg.user_message(CHAT, "start", username="bob")
    sent = await bot.send_message(CHAT, "draft")
    edited = await bot.edit_message_text("final", chat_id=CHAT, message_id=sent.message_id)
    assert isinstance(edited, telegram.Message)
    assert edited.text == "final"
    assert edited.edit_date is not None
    with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
        await bot.edit_message_text("final", chat_id=CHAT, message_id=sent.message_id)
    assert await bot.send_chat_action(CHAT, "typing")
    assert await bot.set_my_commands([("help", "Show help")])
    assert [c.command for c in await bot.get_my_commands()] == ["help"]
    chat = await bot.get_chat(CHAT)
    assert chat.type == "private"
    assert chat.username == "bob"
    assert await bot.delete_message(CHAT, sent.message_id)
    assert tg.messages_to(CHAT) == []
    with pytest.raises(BadRequest, match=r"(?i)message to delete not found"):
        await bot.delete_message(CHAT, sent.message_id)


async def test_ptb_application_polling_round_trip(tg: FakeTelegramServer) -> None:
    """A PTB Application polls an update, its handler replies, and stop() acknowledges it."""
    app = ApplicationBuilder().token(tg.token).base_url(tg.base_url).build()

    async def echo(update: telegram.Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        await update.effective_message.reply_text(f"echo: {update.effective_message.text}")

    app.add_handler(MessageHandler(filters.TEXT, echo))
    async with app:
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0, timeout=1)
        await app.start()
        pushed = tg.user_message(CHAT, "ping")
        [reply] = await tg.wait_for_sent(lambda c: c.method == "sendMessage", timeout=5)
        await app.updater.stop()
        await app.stop()
    assert reply.text == "echo: ping"
    assert reply.chat_id == CHAT
    assert tg.calls("deleteWebhook")  # PTB's polling bootstrap
    assert tg.confirmed_offset == pushed["update_id"] + 1


# ------------------------------------------------------------------------- Slack


async def test_slack_auth_test(slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """auth.test answers the bot's team_id, user_id and bot_id."""
    response = await web_client.auth_test()
    assert response["team_id"] == slack.team_id
    assert response["user_id"] == slack.bot_user_id
    assert response["bot_id"] == slack.bot_id
    assert slack.calls[0].token == slack.bot_token


async def test_slack_post_in_thread(slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """chat.postMessage returns increasing ts and threads replies under thread_ts."""
    [mention, _] = slack.mention_events("U0HUMAN", "help me")
    root_ts = mention["event"]["ts"]
    reply = await web_client.chat_postMessage(channel="C0FAKEGEN", text="on it", thread_ts=root_ts)
    second = await web_client.chat_postMessage(channel="C0FAKEGEN", text="top level")
    assert reply["channel"] == "C0FAKEGEN"
    assert float(second["ts"]) > float(reply["ts"]) > float(root_ts)
    assert reply["message"]["thread_ts"] == root_ts
    assert reply["message"]["parent_user_id"] == "U0HUMAN"
    assert [p.text for p in slack.posts(channel="C0FAKEGEN", thread_ts=root_ts)] == ["on it"]
    assert len(slack.posts(channel="C0FAKEGEN")) == 2

    dm = await web_client.chat_postMessage(channel="U0HUMAN", text="psst")
    assert dm["channel"] == "D0HUMAN"  # posting to a user id opens the IM "D..."
    with pytest.raises(SlackApiError) as caught:
        await web_client.chat_postMessage(channel="C0NOWHERE", text="x")
    assert caught.value.response["error"] == "channel_not_found"


async def test_slack_rate_limited(slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """A 429 with Retry-After surfaces as SlackApiError when retries are disabled."""
    slack.add_channel("C0OPS", name="ops")
    slack.fail_next("chat.postMessage", retry_after=3)
    with pytest.raises(SlackApiError) as caught:
        await web_client.chat_postMessage(channel="C0OPS", text="x")
    assert caught.value.response.status_code == 429
    assert caught.value.response.headers["Retry-After"] == "3"
    assert caught.value.response["error"] == "ratelimited"
    ok = await web_client.chat_postMessage(channel="C0OPS", text="x")
    assert ok["ok"]


async def test_slack_invalid_auth(slack: FakeSlackServer) -> None:
    """A wrong bot token is answered with invalid_auth."""
    client = AsyncWebClient(token="xoxb-wrong", base_url=slack.api_base_url, retry_handlers=[])
    with pytest.raises(SlackApiError) as caught:
        await client.auth_test()
    assert caught.value.response["error"] == "invalid_auth"


async def test_slack_misc_methods(slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """chat.update, reactions.add, users.info and conversations.info follow Slack's rules."""
    dm = slack.dm_event("U0ALICE", "hi")
    channel, user_ts = dm["event"]["channel"], dm["event"]["ts"]
    await web_client.reactions_add(channel=channel, timestamp=user_ts, name="eyes")
    with pytest.raises(SlackApiError, match="already_reacted"):
        await web_client.reactions_add(channel=channel, timestamp=user_ts, name="eyes")
    with pytest.raises(SlackApiError, match="invalid_name"):
        await web_client.reactions_add(channel=channel, timestamp=user_ts, name=":eyes:")
    posted = await web_client.chat_postMessage(channel=channel, text="draft")
    updated = await web_client.chat_update(channel=channel, ts=posted["ts"], text="final")
    assert updated["message"]["text"] == "final"
    with pytest.raises(SlackApiError, match="cant_update_message"):
        await web_client.chat_update(channel=channel, ts=user_ts, text="nope")
    user = await web_client.users_info(user="U0ALICE")
    assert user["user"]["id"] == "U0ALICE"
    assert not user["user"]["is_bot"]
    info = await web_client.conversations_info(channel=channel)
    assert info["channel"]["is_im"]
    assert info["channel"]["user"] == "U0ALICE"
    eph = await web_client.chat_postEphemeral(channel=channel, user="U0ALICE", text="shh")
    assert eph["message_ts"]


async def test_slack_conversations_open_answers_the_dm_channel(
        slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """conversations.open with one user answers the bot's IM with them (the same id again,
    then marked already open), and a message posted there is recorded in that channel."""
    slack.add_user("U0ALICE")
    opened = await web_client.conversations_open(users="U0ALICE")
    dm = opened["channel"]["id"]
    assert (dm.startswith("D"), opened.get("already_open")) == (True, None)
    again = await web_client.conversations_open(users="U0ALICE", return_im=True)
    assert (again["channel"]["id"], again["already_open"], again["no_op"]) == (dm, True, True)
    assert (again["channel"]["is_im"], again["channel"]["user"]) == (True, "U0ALICE")
    assert slack.dm_event("U0ALICE", "hi")["event"]["channel"] == dm  # the one IM
    await web_client.chat_postMessage(channel=dm, text="ping")
    assert [(c.channel, c.text) for c in slack.posts()] == [(dm, "ping")]
    assert slack.opened() == [("U0ALICE", dm), ("U0ALICE", dm)]


async def test_slack_conversations_open_refuses_as_slack_does(
        slack: FakeSlackServer, web_client: AsyncWebClient) -> None:
    """Unknown and deactivated users, no users, a channel that is not an IM and more than
    8 users are refused with Slack's error codes; several users open one MPIM."""
    slack.add_user("U0BOB")
    slack.add_user("U0GONE")["deleted"] = True
    slack.add_channel("C0TEAM")
    refusals = [({"users": "U0NOBODY"}, "user_not_found"),
                ({"users": "U0GONE"}, "user_disabled"),
                ({"users": ""}, "users_list_not_supplied"),
                ({"channel": "C0TEAM"}, "method_not_supported_for_channel_type"),
                ({"channel": "D0NOTHING"}, "channel_not_found"),
                ({"users": ",".join(f"U0X{n}" for n in range(9))}, "too_many_users")]
    for n in range(9):
        slack.add_user(f"U0X{n}")
    for params, error in refusals:
        with pytest.raises(SlackApiError) as caught:
            await web_client.conversations_open(**params)
        assert caught.value.response["error"] == error, params
    group = await web_client.conversations_open(users="U0BOB,U0X1")
    assert (await web_client.conversations_open(users="U0X1,U0BOB"))["channel"]["id"] == \
        group["channel"]["id"]
    info = await web_client.conversations_info(channel=group["channel"]["id"])
    assert (info["channel"]["is_mpim"], info["channel"]["is_im"]) == (True, False)
    assert slack.opened() == [("U0BOB,U0X1", group["channel"]["id"]),
                              ("U0X1,U0BOB", group["channel"]["id"])]


def test_slack_signature_verifies(slack: FakeSlackServer) -> None:
    """Headers from server.sign pass slack_sdk's SignatureVerifier; tampering fails."""
    body = orjson.dumps(slack.dm_event("U0BOB", "hello"))
    headers = slack.sign(body)
    verifier = SignatureVerifier(slack.signing_secret)
    assert verifier.is_valid(
        body.decode(), headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"]
    )
    assert not verifier.is_valid(
        body.decode() + " ", headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"]
    )


async def test_slack_deliver_event_with_retry_headers(slack: FakeSlackServer) -> None:
    """deliver_event POSTs signed event_callback envelopes with Slack's retry headers."""
    first, second = slack.mention_events("U0CAROL", "what's up", channel="C0TEAM")
    assert first["event"]["type"] == "app_mention"
    assert second["event"]["type"] == "message"
    assert first["event"]["ts"] == second["event"]["ts"]
    assert first["event"]["channel"] == second["event"]["channel"] == "C0TEAM"
    assert first["event_id"] != second["event_id"]
    assert first["event"]["text"].startswith(f"<@{slack.bot_user_id}>")

    async with _Receiver() as receiver:
        status, _ = await slack.deliver_event(receiver.url, first)
        status_retry, _ = await slack.deliver_event(receiver.url, first, retry_num=1)
    assert status == status_retry == 200
    verifier = SignatureVerifier(slack.signing_secret)
    for headers, body in receiver.requests:
        assert verifier.is_valid_request(body, headers)
        assert orjson.loads(body)["event_id"] == first["event_id"]
    assert "X-Slack-Retry-Num" not in receiver.requests[0][0]
    assert receiver.requests[1][0]["X-Slack-Retry-Num"] == "1"
    assert receiver.requests[1][0]["X-Slack-Retry-Reason"] == "http_timeout"


async def test_slack_bolt_http_app_replies(slack: FakeSlackServer) -> None:
    """A real slack_bolt AsyncApp verifies the delivered mention and replies via the fake."""
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_base_url)
    app = AsyncApp(signing_secret=slack.signing_secret, client=client)  # token from client

    @app.event("app_mention")
    async def on_mention(event: dict[str, str], say: object) -> None:
        await say(text=f"hi <@{event['user']}>", thread_ts=event["ts"])  # type: ignore[operator]

    runner = web.AppRunner(app.web_app(path="/slack/events"), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    try:
        mention, _ = slack.mention_events("U0DAVE", "ping")
        status, _ = await slack.deliver_event(url, mention)
        assert status == 200
        [post] = await slack.wait_for_call(lambda c: c.method == "chat.postMessage")
        assert post.text == "hi <@U0DAVE>"
        assert post.thread_ts == mention["event"]["ts"]
        bad_status, _ = await slack.deliver_event(url, mention, signature="v0=deadbeef")
        assert bad_status == 401
    finally:
        await runner.cleanup()


async def test_slack_socket_mode_event_and_ack(slack: FakeSlackServer) -> None:
    """SocketModeClient connects via apps.connections.open, gets an event and acks it."""
    received: list[SocketModeRequest] = []

    async def listener(client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        received.append(request)
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))

    web_client = AsyncWebClient(base_url=slack.api_base_url)
    client = SocketModeClient(app_token=slack.app_token, web_client=web_client)
    client.socket_mode_request_listeners.append(listener)
    try:
        await client.connect()  # type: ignore[no-untyped-call]
        await asyncio.wait_for(slack.socket_connected.wait(), 3)
        envelope_id = await slack.socket_send_event(slack.dm_event("U0ERIN", "over socket"))
        ack = await slack.wait_for_ack(envelope_id, timeout=3)
    finally:
        await client.close()  # type: ignore[no-untyped-call]
    assert ack == {"envelope_id": envelope_id}
    assert [r.type for r in received] == ["events_api"]
    assert received[0].payload["event"]["text"] == "over socket"
    assert slack.calls_of("apps.connections.open")[0].token == slack.app_token

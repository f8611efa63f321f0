"""Slack Events API payloads -> :class:`gateway.edge.messages.Inbound` (pure: no I/O, no clock).

What counts as a message to the bot:

* a direct message (``message`` with ``channel_type: im``): the conversation is the DM, or
  the DM thread when the message is in one;
* a channel mention (``app_mention``, or its ``message`` twin whose text mentions the bot):
  the conversation is the thread, ``thread_ts`` or the message's own ``ts`` when it starts one.

The workspace (``team_id``) is the tenant. Both twins of a mention, and Slack's retries, get
the same ``platform_id`` ``"{team}:{channel}:{ts}"`` so the duplicates are dropped before they
reach a session. Everything else is :class:`Ignored` with a short reason for the debug log:
bot messages (ours included), edits, deletions and other subtypes, channel messages that do
not mention the bot, and messages left empty once the mention is removed (unless they carry
files: a file alone is a message, with empty text).

Files: :func:`files_of` says which of an event's ``files`` to download (``url_private_download``)
and which not (over the size limit, not hosted by Slack, or at a URL the bot token must not be
sent to: :func:`token_allowed`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from gateway.edge.ids import InvalidIdError, valid_id
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender

CHANNEL: Final = "slack"

META_TS: Final = "ts"
"""``Inbound.meta`` key: the Slack ts of the person's message (the reaction target)."""
META_REPLY_THREAD: Final = "thread_ts"
"""``Inbound.meta`` key: the ``thread_ts`` replies are posted under."""

# Subtypes that are still a person writing to us; every other subtype (edits, deletions,
# joins, bot_message, ...) is ignored.
PERSON_EVENTS: Final = frozenset({"message", "app_mention"})
"""The event types that carry what people say (the endpoint routes these to the channel)."""
_PERSON_SUBTYPES: Final = frozenset({None, "file_share", "thread_broadcast"})
_MULTI_PARTY: Final = frozenset({"channel", "group", "mpim"})
# Cc characters except \t and \n: they garble logs and mean nothing in a chat. Lone surrogates
# (a JSON "\udc00" escape) too: no UTF-8 session log can hold them.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_ENTITY: Final = re.compile(r"<([^<>]*)>")
_TEAM_ID: Final = re.compile(r"[TE][A-Z0-9]{1,31}")
"""A workspace (``T...``) or Enterprise Grid (``E...``) id as Slack issues them. A Slack tenant
is only ever one of these, so a signed event naming ``default`` or ``web`` cannot write into
the tenant the web chat and Telegram share (nor any other name the gateway gives itself)."""
TRUNCATED: Final = " … [truncated]"


@dataclass(frozen=True, slots=True)
class Ignored:
    """A payload that is not a message for the bot; ``reason`` is short and secret-free."""

    reason: str


def to_inbound(
    body: Mapping[str, Any],
    *,
    bot_user_id: str | None,
    max_chars: int = 16_000,
    received_at: float = 0.0,
) -> Inbound | Ignored:
    """Translate one ``event_callback`` envelope (as POSTed or pushed over Socket Mode)."""
    event = body.get("event")
    if not isinstance(event, Mapping):
        return Ignored("no event")
    kind = event.get("type")
    if not isinstance(kind, str) or kind not in PERSON_EVENTS:
        return Ignored(f"event type {_short(kind)}")
    subtype = event.get("subtype")
    if not isinstance(subtype, str | None) or subtype not in _PERSON_SUBTYPES:
        return Ignored(f"subtype {_short(subtype)}")
    user = event.get("user")
    if event.get("bot_id"):
        # Any bot, ours included (bolt drops ours before us; this keeps convert safe alone).
        return Ignored("bot message")
    if not isinstance(user, str) or not user:
        return Ignored("no user")
    if bot_user_id is not None and user == bot_user_id:
        return Ignored("own message")
    channel, ts = event.get("channel"), event.get("ts")
    if not isinstance(channel, str) or not channel or not isinstance(ts, str) or not ts:
        return Ignored("no channel or ts")
    team = _team(body, event)
    if team is None:
        return Ignored("no valid team id")
    raw_text = event.get("text")
    raw_text = raw_text if isinstance(raw_text, str) else ""
    thread_ts = event.get("thread_ts")
    thread_ts = thread_ts if isinstance(thread_ts, str) and thread_ts else None

    direct = kind == "message" and event.get("channel_type") == "im"
    if not direct:
        if kind == "message" and event.get("channel_type") not in _MULTI_PARTY:
            return Ignored(f"channel type {_short(event.get('channel_type'))}")
        if kind == "message" and not mentions(raw_text, bot_user_id):
            return Ignored("channel message without a mention")
    text = clean_text(raw_text, bot_user_id)
    if not text and not event.get("files"):
        return Ignored("empty text")
    if len(text) > max_chars:
        text = text[: max(0, max_chars - len(TRUNCATED))] + TRUNCATED

    key = ConversationKey(
        channel=CHANNEL, chat=channel, tenant=team,
        thread=thread_ts if direct else (thread_ts or ts),
    )
    chat_type = "private" if direct else str(event.get("channel_type") or "channel")
    return Inbound(
        key=key,
        sender=Sender(user),
        text=text,
        platform_id=f"{team}:{channel}:{ts}",
        chat_type=chat_type,
        received_at=received_at,
        meta={META_TS: ts, META_REPLY_THREAD: thread_ts or ts},
    )


def mentions(text: str, bot_user_id: str | None) -> bool:
    """True if ``text`` contains the ``<@BOT>`` mention token."""
    return bot_user_id is not None and (
        f"<@{bot_user_id}>" in text or f"<@{bot_user_id}|" in text
    )


def clean_text(text: str, bot_user_id: str | None) -> str:
    """Slack's wire text as the model should read it.

    The bot's own mention is removed; links become ``label (url)`` or ``url``, channels
    ``#name``, special mentions ``@here``; other user mentions stay ``<@U…>`` (the id is all
    the event carries); ``&amp;``, ``&lt;``, ``&gt;`` are unescaped last, so an escaped ``<``
    never forms an entity.
    """

    if bot_user_id:
        # The mention goes with the space before it: "hey <@B> there" -> "hey there".
        text = re.sub(rf"\s*<@{re.escape(bot_user_id)}(?:\|[^<>]*)?>", "", text)

    def entity(match: re.Match[str]) -> str:
        target, _, label = match.group(1).partition("|")
        if target.startswith("@"):
            return match.group(0)
        if target.startswith("#"):
            return f"#{label}" if label else target
        if target.startswith("!"):
            special = target[1:].split("^", 1)[0]
            return label if label else f"@{special}"
        if label and label != target.removeprefix("mailto:"):
            return f"{label} ({target})"
        return label or target

    out = _ENTITY.sub(entity, text)
    out = out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return _CONTROL.sub("", out).strip()


def _team(body: Mapping[str, Any], event: Mapping[str, Any]) -> str | None:
    """The workspace that installed us: the envelope's ``team_id`` (the event's ``team`` is
    the author's workspace, which differs in shared channels)."""
    candidates: list[object] = [body.get("team_id")]
    authorizations = body.get("authorizations")
    if isinstance(authorizations, list) and authorizations:
        first = authorizations[0]
        if isinstance(first, Mapping):
            candidates.append(first.get("team_id"))
    candidates.append(event.get("team"))
    for value in candidates:
        if isinstance(value, str) and value:
            return team_id(value)
    return None


def team_id(value: str) -> str | None:
    """``value`` if it has the shape of a Slack team id (:data:`_TEAM_ID`), else None."""
    return value if _TEAM_ID.fullmatch(value) else None


def _short(value: object) -> str:
    return str(value)[:40]


SLASH_COMMAND: Final = "/gateway"
"""The Slack slash command serving the chat commands (``/gateway new``, ``/gateway help``):
Slack keeps every message that starts with ``/`` for itself, so ``/new`` never arrives as text."""


@dataclass(frozen=True, slots=True)
class SlashCommand:
    """A ``/gateway WORD`` invocation: the command word and, in a DM, the message that carries
    it to the router (``/WORD`` in the DM's conversation); outside a DM no conversation."""

    word: str
    inbound: Inbound | None


def from_slash_command(body: Mapping[str, Any], *, received_at: float = 0.0) -> SlashCommand:
    """Translate a slash-command payload (form fields as bolt parses them)."""
    text = _CONTROL.sub("", str(body.get("text") or "")).strip()
    word = text.split(maxsplit=1)[0].lower() if text else "help"
    team, channel, user = (str(body.get(k) or "") for k in ("team_id", "channel_id", "user_id"))
    if body.get("channel_name") != "directmessage" or not (team and channel and user):
        return SlashCommand(word, None)
    tenant = team_id(team)
    if tenant is None:
        return SlashCommand(word, None)
    try:
        key = ConversationKey(CHANNEL, valid_id(channel, "Slack channel"), tenant)
        sender = Sender(valid_id(user, "Slack user"))
    except InvalidIdError:
        return SlashCommand(word, None)
    # Slack sends a fresh trigger_id with every invocation; its retries keep it.
    trigger = str(body.get("trigger_id") or f"at-{received_at}")
    # The words after the command go along (``/gateway forget confirm`` -> ``/forget confirm``).
    rest = text.split(maxsplit=1)[1] if len(text.split(maxsplit=1)) > 1 else ""
    inbound = Inbound(key=key, sender=sender, text=f"/{word} {rest}".rstrip(), chat_type="private",
                      received_at=received_at, platform_id=f"{team}:{channel}:command:{trigger}")
    return SlashCommand(word, inbound)


# -- files -------------------------------------------------------------------------------------

SLACK_FILE_HOST: Final = "files.slack.com"
"""Where Slack serves ``url_private_download``: the one host (with the API's own) that may
receive the bot token."""
_UNAVAILABLE_MODES: Final = frozenset({"external", "tombstone", "hidden_by_limit"})


@dataclass(frozen=True, slots=True)
class SlackFile:
    """A file to download with the bot token, and what the core is told about it."""

    url: str
    name: str
    media_type: str
    kind: str
    size: int | None


def token_allowed(url: str, api_base_url: str | None) -> bool:
    """Whether the bot token may be sent to ``url``: only to Slack's file host over HTTPS, or
    to the host (scheme, name and port) of ``SLACK_API_BASE_URL``. An event can name any URL;
    the token never follows one anywhere else."""
    try:
        target = urlsplit(url)
        if target.scheme == "https" and target.hostname == SLACK_FILE_HOST and (
                target.port in (None, 443)) and not target.username:
            return True
        if api_base_url:
            api = urlsplit(api_base_url)
            return (target.scheme, target.netloc.lower()) == (api.scheme, api.netloc.lower()) \
                and bool(api.netloc)
    except ValueError:  # an unparsable URL (a bad port, say) goes nowhere
        return False
    return False


def files_of(event: Mapping[str, Any], *, max_bytes: int,
             api_base_url: str | None) -> list[SlackFile | Attachment]:
    """The files of a ``message``/``app_mention`` event: to download (:class:`SlackFile`) or,
    as an :class:`Attachment` with a ``problem``, not (too large, unavailable, or at a URL the
    token must not go to)."""
    found: list[SlackFile | Attachment] = []
    files = event.get("files")
    if not isinstance(files, list):
        return found
    for item in files:
        if not isinstance(item, Mapping):
            continue
        name = _str(item.get("name")) or _str(item.get("title")) or "file"
        claimed = _str(item.get("mimetype")) or "application/octet-stream"
        size = item.get("size") if type(item.get("size")) is int else None
        kind = "voice" if item.get("subtype") == "slack_audio" else "file"
        url = _str(item.get("url_private_download")) or _str(item.get("url_private"))
        refused = Attachment(name, claimed, kind=kind, size=size, problem="unavailable")
        if item.get("mode") in _UNAVAILABLE_MODES or url is None:
            found.append(refused)
        elif size is not None and size > max_bytes:
            found.append(Attachment(name, claimed, kind=kind, size=size, problem="too-large"))
        elif not token_allowed(url, api_base_url):
            found.append(Attachment(name, claimed, kind=kind, size=size,
                                    problem="download-failed"))
        else:
            found.append(SlackFile(url, name, claimed, kind, size))
    return found


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None

"""The composition root, channel half: concrete channels built from settings.

Channels depend on the core's seam only (:mod:`gateway.edge.channel`); everything a channel needs
from outside (settings values, a leader elector, the history port) is chosen here and passed
to its constructor. Redeliveries are not a channel's business: the router's one duplicate
check (the coordinator's owed journal) recognises them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from app.config import Settings
from app.hints import replay_hint
from gateway.edge.channel import Channel
from gateway.edge.coordination import Coordinator
from gateway.edge.errors import ConfigError
from gateway.edge.history import History
from gateway.edge.hosts import TrustedProxies
from gateway.edge.metrics import Metrics
from sessions.files import FILE_MODE, ensure_private_dir, write_all

if TYPE_CHECKING:  # imported when built: a gateway without the channel never loads it
    from channels.console.channel import ConsoleChannel


def web_channel(settings: Settings, history: History) -> Channel:
    from channels.web.channel import WebChannel
    from channels.web.identity import WebIdentities

    token = settings.web_token.get_secret_value() if settings.web_token else None
    identities = WebIdentities(shared_web_identity_key(settings),
                               token=token.encode() if token else None)
    return WebChannel(
        history=history, host=settings.host, token=token,
        max_message_chars=settings.max_message_chars,
        reply_timeout=settings.provider_timeout + 30.0,
        shutdown_grace=settings.shutdown_grace,
        max_body_bytes=settings.max_request_bytes,
        replay_command=replay_hint(settings.data_dir, settings.web_tenant),
        tenant=settings.web_tenant, identities=identities,
        proxies=TrustedProxies.parse(settings.trusted_proxies),
    )


WEB_IDENTITY_KEY = "web-identity.key"


def shared_web_identity_key(settings: Settings) -> bytes:
    """This worker's web identity key (:func:`web_identity_key`), or, with Redis, the one the
    workers agreed on (written back to the file: :mod:`coordination.shared_key`), so a browser
    is one person, with one set of conversations, whichever worker answers it."""
    mine = web_identity_key(settings.data_dir)
    if settings.redis_url is None:
        return mine
    from coordination.keys import Keys
    from coordination.shared_key import agreed_key

    agreed = agreed_key(settings.redis_url.get_secret_value(),
                        Keys(settings.redis_prefix).web_identity_key, mine)
    if agreed != mine:
        write_private(settings.data_dir / "state" / WEB_IDENTITY_KEY, agreed)
    return agreed


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (0600), whole or not at all."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)


def web_identity_key(data_dir: Path) -> bytes:
    """The key web identities are signed with: ``<data>/state/web-identity.key`` (0600),
    made on first use, so browsers keep their identity across restarts."""
    folder = ensure_private_dir(data_dir / "state")
    path = folder / WEB_IDENTITY_KEY
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, FILE_MODE)
            except FileExistsError:
                continue  # made meanwhile by another process: read it
            try:
                key = secrets.token_bytes(32)
                write_all(fd, key)
                os.fsync(fd)
            finally:
                os.close(fd)
            return key
        try:
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        if len(key) >= 32:
            return key
        raise ConfigError(f"{path} is not a web identity key (remove it to make a new one)")
    raise ConfigError(f"cannot read or create {path}")


def telegram_channel(settings: Settings, metrics: Metrics, coordinator: Coordinator) -> Channel:
    # PTB 22 warns on every RetryAfter unless told to use timedelta values (its documented
    # opt-in); we want the new behaviour, not a warning per 429.
    os.environ.setdefault("PTB_TIMEDELTA", "1")
    from channels.telegram.adapter import TelegramChannel, TelegramOptions, build_bot

    if settings.telegram_bot_token is None:
        raise ConfigError("GATEWAY_CHANNELS=telegram needs TELEGRAM_BOT_TOKEN")
    token = settings.telegram_bot_token.get_secret_value()
    secret = settings.telegram_webhook_secret
    options = TelegramOptions(
        mode=settings.telegram_mode,
        webhook_secret=secret.get_secret_value() if secret else None,
        webhook_url=settings.telegram_webhook_url or None,
        group_mode=settings.telegram_group_mode,
        max_message_chars=settings.max_message_chars,
        poll_timeout=settings.telegram_poll_timeout,
        stall_seconds=settings.telegram_stall_seconds,
        close_grace=settings.shutdown_grace,
        typing_delay=settings.typing_delay,
        max_attachment_bytes=settings.max_attachment_bytes,
    )
    rate_limited = settings.telegram_rate_limit == "on"
    bot = build_bot(token, settings.telegram_api_base_url, rate_limit=rate_limited,
                    base_file_url=settings.telegram_file_base_url)
    # One election per bot (a hash of the token names it, never the token itself).
    bot_hash = hashlib.sha256(token.encode()).hexdigest()[:16]
    return TelegramChannel(bot, token=token, metrics=metrics, options=options,
                           rate_limited=rate_limited,
                           elector=coordinator.elector(f"telegram-poll:{bot_hash}"))


def slack_channel(settings: Settings, metrics: Metrics, coordinator: Coordinator, *,
                  edit_interval: float = 1.0) -> Channel:
    from channels.slack.adapter import SlackChannel

    if settings.slack_bot_token is None:
        raise ConfigError("GATEWAY_CHANNELS includes slack but SLACK_BOT_TOKEN is not set")
    app_token = (settings.slack_app_token.get_secret_value()
                 if settings.slack_app_token is not None else None)
    signing = settings.slack_signing_secret
    elector = None
    if app_token:
        # One election per app (a hash of its token names it, never the token itself).
        app_hash = hashlib.sha256(app_token.encode()).hexdigest()[:16]
        elector = coordinator.elector(f"slack-socket:{app_hash}")
    return SlackChannel(
        bot_token=settings.slack_bot_token.get_secret_value(),
        signing_secret=signing.get_secret_value() if signing is not None else None,
        app_token=app_token,
        api_base_url=settings.slack_api_base_url,
        metrics=metrics,
        max_message_chars=settings.max_message_chars,
        edit_interval=edit_interval,
        typing_delay=settings.typing_delay,
        elector=elector,
        max_attachment_bytes=settings.max_attachment_bytes,
        # An allowlist by @username needs the sender's name before access control decides.
        names_before_access=any(u.startswith("@")
                                for u in Settings.id_list(settings.slack_allowed_users)),
    )


def console_channel(settings: Settings, history: History, *, conversation: str,
                    replay_command: str) -> ConsoleChannel:
    from channels.console.channel import ConsoleChannel

    return ConsoleChannel(history=history, conversation=conversation,
                          max_message_chars=settings.max_message_chars,
                          max_attachment_bytes=settings.max_attachment_bytes,
                          replay_command=replay_command)


def build_channels(settings: Settings, history: History, metrics: Metrics,
                   coordinator: Coordinator) -> list[Channel]:
    """The channels ``GATEWAY_CHANNELS`` names. Shared by workers: long polling and Socket
    Mode run on the elected leader."""
    channels: list[Channel] = []
    for name in settings.channel_names:
        if name == "web":
            channels.append(web_channel(settings, history))
        elif name == "telegram":
            channels.append(telegram_channel(settings, metrics, coordinator))
        elif name == "slack":
            channels.append(slack_channel(settings, metrics, coordinator))
    return channels

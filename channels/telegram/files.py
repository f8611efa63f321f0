"""Fetching the files of a Telegram message: PTB's ``get_file`` then its download (I/O only).

Which files, and which not, is decided by :func:`channels.telegram.convert.files_of` (pure).
Downloads come from the bot's ``base_file_url`` (``TELEGRAM_FILE_BASE_URL``, see
:func:`file_base_url`). A file that cannot be fetched is handed on as an
:class:`~gateway.messages.Attachment` with a ``problem`` (the core tells the person), never
dropped; the failure is logged without the token (the download URL contains it).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Final
from urllib.parse import urlsplit

from telegram import Message
from telegram.error import BadRequest

from channels.telegram.convert import TelegramFile, files_of
from channels.telegram.sink import BotApi
from gateway.messages import Attachment, Inbound

DEFAULT_FILE_BASE_URL: Final = "https://api.telegram.org/file/bot"
DOWNLOAD_TIMEOUT: Final = 60.0
"""Seconds a download may take to arrive (20 MB over a slow link)."""


def file_base_url(api_base_url: str | None, file_base_url: str | None) -> str:
    """``TELEGRAM_FILE_BASE_URL`` when set; else derived from ``TELEGRAM_API_BASE_URL`` when
    that ends in ``/bot`` (``http://h:p/bot`` -> ``http://h:p/file/bot``, how a self-hosted Bot
    API server serves files); else Telegram's own."""
    if file_base_url:
        return file_base_url
    if api_base_url and api_base_url.endswith("/bot"):
        return api_base_url[: -len("/bot")] + "/file/bot"
    return DEFAULT_FILE_BASE_URL


async def with_files(api: BotApi, message: Message, inbound: Inbound,
                     max_bytes: int) -> Inbound:
    """``inbound`` with the message's files as attachments (in message order), each fetched
    only when the core takes it in (after the access gate: a stranger's files are never
    downloaded)."""
    wanted = files_of(message, max_bytes)
    if not wanted:
        return inbound
    attachments = [item if isinstance(item, Attachment) else pending(api, item)
                   for item in wanted]
    return dataclasses.replace(inbound, attachments=tuple(attachments))


def pending(api: BotApi, wanted: TelegramFile) -> Attachment:
    """The attachment as Telegram describes it, downloaded by its ``fetch``."""
    return Attachment(wanted.name, wanted.media_type, kind=wanted.kind, size=wanted.size,
                      fetch=functools.partial(download, api, wanted))


async def download(api: BotApi, wanted: TelegramFile) -> Attachment:
    """One file's bytes, or an attachment that says why there are none."""
    failed = Attachment(wanted.name, wanted.media_type, kind=wanted.kind, size=wanted.size,
                        problem="download-failed")
    try:
        found = await api.request(lambda: api.bot.get_file(wanted.file_id))
        # PTB reads a *local* file when the path it is given exists on this machine; only a
        # URL (under the file base URL) is ever fetched.
        if urlsplit(found.file_path or "").scheme not in ("http", "https"):
            return failed
        data = bytes(await found.download_as_bytearray(read_timeout=DOWNLOAD_TIMEOUT))
    except BadRequest as exc:
        api.failed("getFile", exc)
        if "too big" in exc.message.lower():
            return dataclasses.replace(failed, problem="too-large")
        return failed
    except Exception as exc:  # the person is told it could not be fetched; nothing is lost
        api.failed("file download", exc)
        return failed
    return Attachment(wanted.name, wanted.media_type, data, kind=wanted.kind, size=len(data))

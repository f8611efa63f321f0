"""The files of a Telegram message: handed in as references (their ``file_id``), fetched with
PTB's ``get_file`` then its download as the message's turn starts (I/O only).

Polling handles updates one after another, and a webhook's answer waits for its update: a
download before the message is recorded would hold every other chat's messages (and the next
``getUpdates``) behind one person's large file. So :func:`with_files` only describes the files
(an :class:`~gateway.edge.messages.Attachment` with a ``ref``, the ``file_id``), the message is owed
and confirmed with those references, and the core calls
:meth:`channels.telegram.adapter.TelegramChannel.fetch_file`, i.e. :func:`fetch`, when its turn
starts, in this run or, after a crash or a stop, in the next one (a ``file_id`` stays valid for
the bot).

Which files, and which not, is decided by :func:`channels.telegram.convert.files_of` (pure):
those it refuses (over the size limit Telegram declares, videos) are handed in with their
``problem`` as before, never as references. Downloads come from the bot's ``base_file_url``
(``TELEGRAM_FILE_BASE_URL``, see :func:`file_base_url`). A file that cannot be fetched comes
back with a ``problem`` (the core tells the person), never dropped; the failure is logged
without the token (the download URL contains it). A file is checked against the size cap three
times: by the size the update declares (:func:`~channels.telegram.convert.files_of`), by the
``file_size`` ``getFile`` answers (nothing is downloaded past it), and while downloading: the
download stops once it passes the cap (a self-hosted Bot API server serves files of any size,
and a ``file_size`` may be missing or wrong).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final
from urllib.parse import urlsplit

from telegram import Message
from telegram.error import BadRequest

from channels.telegram.convert import TelegramFile, files_of
from channels.telegram.request import AiohttpRequest
from channels.telegram.sink import BotApi
from gateway.edge.messages import Attachment, Inbound

log = logging.getLogger(__name__)

DEFAULT_FILE_BASE_URL: Final = "https://api.telegram.org/file/bot"
DOWNLOAD_TIMEOUT: Final = 60.0
"""Seconds a download may take to arrive (20 MB over a slow link)."""
REF_FILE_ID: Final = "file_id"
"""The key of an attachment's ``ref`` that holds the file's Telegram ``file_id``."""


def file_base_url(api_base_url: str | None, file_base_url: str | None) -> str:
    """``TELEGRAM_FILE_BASE_URL`` when set; else derived from ``TELEGRAM_API_BASE_URL`` when
    that ends in ``/bot`` (``http://h:p/bot`` -> ``http://h:p/file/bot``, how a self-hosted Bot
    API server serves files); else Telegram's own."""
    if file_base_url:
        return file_base_url
    if api_base_url and api_base_url.endswith("/bot"):
        return api_base_url[: -len("/bot")] + "/file/bot"
    return DEFAULT_FILE_BASE_URL


def with_files(message: Message, inbound: Inbound, max_bytes: int) -> Inbound:
    """``inbound`` with the message's files as attachments (in message order): those to
    download as references (fetched as the turn starts, after the access gate: a stranger's
    files are never downloaded), the others with their ``problem``."""
    wanted = files_of(message, max_bytes)
    if not wanted:
        return inbound
    attachments = [
        item if isinstance(item, Attachment)
        else Attachment(item.name, item.media_type, kind=item.kind, size=item.size,
                        ref={REF_FILE_ID: item.file_id})
        for item in wanted]
    return dataclasses.replace(inbound, attachments=tuple(attachments))


async def fetch(api: BotApi, attachment: Attachment, max_bytes: int) -> Attachment:
    """The file an attachment from :func:`with_files` refers to, downloaded (or with a
    ``problem`` saying why not), never more than ``max_bytes`` of it."""
    file_id = (attachment.ref or {}).get(REF_FILE_ID)
    if not file_id:
        return dataclasses.replace(attachment, problem="download-failed")
    return await download(api, TelegramFile(file_id, attachment.name, attachment.media_type,
                                            attachment.kind, attachment.size), max_bytes)


async def download(api: BotApi, wanted: TelegramFile, max_bytes: int) -> Attachment:
    """One file's bytes, or an attachment that says why there are none (module docstring)."""
    failed = Attachment(wanted.name, wanted.media_type, kind=wanted.kind, size=wanted.size,
                        problem="download-failed")
    transport = api.bot.request
    if not isinstance(transport, AiohttpRequest):  # build_bot always gives it one
        log.warning("telegram: no transport that can download files with a size cap")
        return failed
    try:
        found = await api.request(lambda: api.bot.get_file(wanted.file_id))
        if found.file_size is not None and found.file_size > max_bytes:
            return dataclasses.replace(failed, size=found.file_size, problem="too-large")
        # Only a URL (under the file base URL) is ever fetched: with a local Bot API server
        # the path may name a file on this machine, which is not ours to read.
        url = found.file_path or ""
        if urlsplit(url).scheme not in ("http", "https"):
            return failed
        data = await transport.download(url, max_bytes, DOWNLOAD_TIMEOUT)
        if data is None:
            # Its size is unknown (no more was read): the refusal says only "over the limit".
            return dataclasses.replace(failed, size=None, problem="too-large")
    except BadRequest as exc:
        api.failed("getFile", exc)
        if "too big" in exc.message.lower():
            return dataclasses.replace(failed, problem="too-large")
        return failed
    except Exception as exc:  # the person is told it could not be fetched; nothing is lost
        api.failed("file download", exc)
        return failed
    return Attachment(wanted.name, wanted.media_type, data, kind=wanted.kind, size=len(data))

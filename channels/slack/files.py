"""Downloading the files of a Slack message with the bot token (I/O only).

Which files, and from where, is decided by :func:`channels.slack.convert.files_of` (pure),
which only hands over URLs that :func:`~channels.slack.convert.token_allowed` accepts. Here the
token is sent as an ``Authorization`` header to exactly that URL: redirects are not followed
(a redirect could lead anywhere, the token with it), and an HTML answer for a file that is not
HTML is Slack's sign-in page, not the file. A body larger than the limit is cut off, not read
to the end. A file that cannot be fetched is handed on with a ``problem`` (the core tells the
person), never dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Final

import aiohttp

from channels.slack.convert import SlackFile
from gateway.messages import Attachment, Inbound

log = logging.getLogger("channels.slack")

DOWNLOAD_TIMEOUT: Final = 60.0
_CHUNK: Final = 256 * 1024


async def with_files(session: aiohttp.ClientSession, token: str, inbound: Inbound,
                     wanted: Sequence[SlackFile | Attachment], max_bytes: int) -> Inbound:
    """``inbound`` with ``wanted`` as attachments (in the event's order), each fetched only
    when the core takes it in (after the access gate: a stranger's files are never
    downloaded)."""
    if not wanted:
        return inbound
    attachments = [
        item if isinstance(item, Attachment)
        else Attachment(item.name, item.media_type, kind=item.kind, size=item.size,
                        fetch=functools.partial(download, session, token, item, max_bytes))
        for item in wanted]
    return dataclasses.replace(inbound, attachments=tuple(attachments))


async def download(session: aiohttp.ClientSession, token: str, wanted: SlackFile,
                   max_bytes: int) -> Attachment:
    """One file's bytes, or an attachment that says why there are none."""
    failed = Attachment(wanted.name, wanted.media_type, kind=wanted.kind, size=wanted.size,
                        problem="download-failed")
    try:
        async with session.get(
            wanted.url, headers={"Authorization": f"Bearer {token}"}, allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT),
        ) as response:
            served = response.headers.get("Content-Type", "")
            if response.status != 200 or (served.startswith("text/html")
                                          and not wanted.media_type.startswith("text/html")):
                log.warning("slack: file download refused (HTTP %d)", response.status)
                return failed
            data = bytearray()
            async for chunk in response.content.iter_chunked(_CHUNK):
                data.extend(chunk)
                if len(data) > max_bytes:
                    return dataclasses.replace(failed, size=len(data), problem="too-large")
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("slack: file download failed (%s)", type(exc).__name__)
        return failed
    return Attachment(wanted.name, wanted.media_type, bytes(data), kind=wanted.kind,
                      size=len(data))

"""The files of a Slack message: handed in as references, downloaded with the bot token as the
message's turn starts (after Slack got its acknowledgement).

Slack wants its answer to an event within 3 seconds and retries the event when it is late; a
large or slow file would hold the acknowledgement past that. So :func:`with_files` only
describes the files (an :class:`~gateway.edge.messages.Attachment` with a ``ref``, the URL), the
message is owed and acknowledged with those references, and the core calls
:meth:`channels.slack.adapter.SlackChannel.fetch_file`, i.e. :func:`fetch`, when the turn starts,
in this run or, after a crash or a stop, in the next one.

Which files, and from where, is decided by :func:`channels.slack.convert.files_of` (pure),
which only hands over URLs that :func:`~channels.slack.convert.token_allowed` accepts; the
URL is checked again before the download (it comes back from the owed journal). The token is
sent as an ``Authorization`` header to exactly that URL: redirects are not followed (a
redirect could lead anywhere, the token with it), and an HTML answer for a file that is not
HTML is Slack's sign-in page, not the file. A body larger than the limit is cut off, not read
to the end. A file that cannot be fetched comes back with a ``problem`` (the core tells the
person), never dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Final

import aiohttp

from channels.slack.convert import SlackFile, token_allowed
from gateway.edge.messages import Attachment, Inbound

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT: Final = 60.0
_CHUNK: Final = 256 * 1024
REF_URL: Final = "url"
"""The key of an attachment's ``ref`` that holds the file's download URL."""


def with_files(inbound: Inbound, wanted: Sequence[SlackFile | Attachment]) -> Inbound:
    """``inbound`` with ``wanted`` as attachments (in the event's order): the files to download
    as references (fetched after the acknowledgement, and after the access gate: a stranger's
    files are never downloaded), the others with their ``problem``."""
    if not wanted:
        return inbound
    attachments = [
        item if isinstance(item, Attachment)
        else Attachment(item.name, item.media_type, kind=item.kind, size=item.size,
                        ref={REF_URL: item.url})
        for item in wanted]
    return dataclasses.replace(inbound, attachments=tuple(attachments))


async def fetch(session: aiohttp.ClientSession, token: str, attachment: Attachment, *,
                max_bytes: int, api_base_url: str | None) -> Attachment:
    """The file an attachment from :func:`with_files` refers to, downloaded (or with a
    ``problem`` saying why not)."""
    url = (attachment.ref or {}).get(REF_URL)
    if not url or not token_allowed(url, api_base_url):
        log.warning("slack: a file reference was not downloaded (not a Slack file URL)")
        return dataclasses.replace(attachment, problem="download-failed")
    wanted = SlackFile(url, attachment.name, attachment.media_type, attachment.kind,
                       attachment.size)
    return await download(session, token, wanted, max_bytes)


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

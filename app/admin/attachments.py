"""Attachments in the viewer: thumbnails and file chips in the timeline, the blob route, and
request bodies shown with their base64 elided.

A blob is served only to a signed-in admin (the site's guard), only for a session of the
tenant the admin may see, and only if that session's log refers to it: a hash alone opens
nothing. Images are served inline (the thumbnails); every other file as a download. Both carry
``nosniff`` and a sandboxing CSP, so no uploaded file runs as a page of the viewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from aiohttp import web

from app.admin import urls
from app.admin.markup import Markup, join, tag
from sessions.attachments import IMAGE_TYPES, human_size, ref_of

if TYPE_CHECKING:  # render imports this module
    from app.admin.render import Where

ELIDE_OVER: Final = 256
"""Strings longer than this that hold base64 (image data, data URLs) are shown as a summary."""
_DATA_KEYS: Final = frozenset({"data", "url", "file_data"})


def blob_url(where: Where, digest: str) -> str:
    """``/admin/session/<id>/blob/<hash>`` of the page's session."""
    return urls.session(where.session_id, where.tenant, where.home, f"/blob/{digest}")


def attachment_view(block: Mapping[str, Any], where: Where | None) -> Markup | None:
    """A thumbnail (images) or a chip (other files) with name, type, size and hash; a voice
    note's transcript under it. None when the block is not a well-formed reference."""
    ref = ref_of(dict(block))
    if ref is None:
        return None
    sent = block.get("sent") is True
    url = blob_url(where, ref.hash) if where is not None else None
    facts = f"{ref.media_type} · {human_size(ref.size)}"
    head = tag("div", tag("span", "sent file" if sent else "attachment", class_="label"), " ",
               tag("a", ref.name, href=url, download=ref.name) if url else tag("span", ref.name),
               " ", tag("span", facts, class_="muted"), " ",
               tag("code", ref.hash[:16], title=ref.hash, class_="muted"), class_="block-head")
    parts: list[Markup] = [head]
    if url and ref.media_type in IMAGE_TYPES:
        parts.append(tag("a", tag("img", src=url, alt=ref.name, loading="lazy",
                                  class_="thumbnail"), href=url))
    transcript = block.get("transcript")
    if isinstance(transcript, str):
        parts.append(tag("blockquote", transcript, class_="transcript"))
    return tag("div", join(parts), class_="attachment")


def elided(value: Any) -> Any:
    """``value`` (a request body) with long base64 strings replaced by a summary: what the
    provider received, minus megabytes nobody reads in a page."""
    if isinstance(value, dict):
        return {k: _summary(v) if k in _DATA_KEYS and isinstance(v, str) else elided(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [elided(v) for v in value]
    return value


def _summary(text: str) -> str:
    if len(text) <= ELIDE_OVER:
        return text
    prefix = text.split(",", 1)[0] + "," if text.startswith("data:") else ""
    return f"{prefix}<{len(text) - len(prefix):,} characters of base64, elided here>"


def blob_response(data: bytes, media_type: str, name: str) -> web.Response:
    """A blob for the viewer: images inline, anything else a download; never a page."""
    inline = media_type in IMAGE_TYPES
    disposition = "inline" if inline else "attachment"
    return web.Response(body=data, headers={
        "Content-Type": media_type if inline else "application/octet-stream",
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(name)}",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, max-age=3600",
    })
